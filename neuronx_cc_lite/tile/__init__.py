"""The tile program, the IR between lowering and the engine streams: the program of instructions over virtual
tiles and HBM accesses (program.py), the HBM tensors and views it reads and writes (hbm.py), its verifier
(verify.py) and its text form (printer.py). It imports only isa/ and errors.py, so that lower/, which builds it,
and codegen/, which places and schedules it, both stand on it.
"""
