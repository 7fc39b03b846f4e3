import sys

from tools.difftest.campaign import main

sys.exit(main())
