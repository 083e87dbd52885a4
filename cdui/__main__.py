from __future__ import annotations

import sys
import warnings

# torch warns at import when numpy is absent; numpy is not a dependency of ours.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

from cdui.cli.cli import main  # noqa: E402  (after the warning filter, which must precede the torch import)

if __name__ == "__main__":
    sys.exit(main())
