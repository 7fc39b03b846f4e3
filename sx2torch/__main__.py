import sys

from sx2torch.cli import main

sys.exit(main())
