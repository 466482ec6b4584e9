import sys

from isocompute.cli import main

sys.exit(main())
