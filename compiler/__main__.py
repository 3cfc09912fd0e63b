import sys

from compiler.cli import main

if __name__ == "__main__":     # a spawned child (compiler.fleet.isolated) imports this module too
    sys.exit(main())
