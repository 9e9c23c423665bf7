import sys

from neuronx_cc_lite.interrupts import command

sys.exit(command())
