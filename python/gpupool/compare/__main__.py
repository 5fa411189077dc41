"""python -m gpupool.compare"""

import sys

from . import main

sys.exit(main())
