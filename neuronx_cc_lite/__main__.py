import sys

from neuronx_cc_lite.cli import main

sys.exit(main())
