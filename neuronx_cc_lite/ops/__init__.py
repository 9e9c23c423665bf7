"""What the compiler knows of ONNX ops apart from how it lowers them: the op registry (registry.py, each op's
lowering and facts, filled by lower/), the ops' traits (traits.py), what their attributes say (attributes.py) and
the device type of each ONNX element type (dtypes.py). It stands below the passes, partitioning and the lowerings,
which all read it; of them it imports only lower/, and only when the registry is first read (registry.lowerings),
for the lowerings to register themselves."""
