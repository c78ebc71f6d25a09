"""The run presets that ship with llamafast (installed as llamafast.configs): `--config NAME` finds them."""
