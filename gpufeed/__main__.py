import sys

from gpufeed.cli import main

sys.exit(main())
