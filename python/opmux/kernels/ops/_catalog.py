"""The op groups. Adding a group is this one line plus its folder (with a torch-free spec.py)."""

GROUPS: tuple[str, ...] = (
    "activation",
    "layernorm",
    "moe",
    "kvcache",
    "quantization",
    "rope",
)
