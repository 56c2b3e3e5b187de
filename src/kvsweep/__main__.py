import sys

from kvsweep.cli import main

sys.exit(main())
