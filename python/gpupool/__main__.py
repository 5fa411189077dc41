"""``python -m gpupool``: the ``gpupool`` command (``info``, ``demo``, ``bench``, ``--version``)."""

import sys

from ._cli import main

sys.exit(main())
