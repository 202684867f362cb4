"""Tools beside the product: benchmarks, the divergence-limit calibration and the data generators.

Nothing under flows/, evalsets/, load/, gates/ or infra/ imports them (an import-linter contract).
"""
