"""What one machine can hold: the compiler checks sizes against these with the consts at
their defaults, and a generated module checks a stack's layer count against them when it is
built with other arguments (a larger model would grow in memory until it is killed; 2**36 f32
elements are 256 GiB)."""

MAX_ELEMENTS = 2**36
MAX_LAYERS = 2**16
