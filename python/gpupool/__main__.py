"""``python -m gpupool``: the ``gpupool`` command (``info``, ``demo``, ``bench``, ``compare``, ``--version``)."""

import sys

from ._cli import main

sys.exit(main())
