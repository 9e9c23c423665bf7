import sys

from neuronx_cc_lite.interrupts import main

sys.exit(main())
