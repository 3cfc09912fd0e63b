import sys

from compiler.cli import main

sys.exit(main())
