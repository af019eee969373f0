"""The Python APIs import without Lightning: `import streamrec` and `import translate` in a fresh interpreter (this
one has imported Lightning already), both in one, since neither may bring it in."""

from __future__ import annotations

import subprocess
import sys


def test_the_packages_export_their_apis_without_importing_lightning():
    code = (
        "import sys, streamrec, translate; assert 'lightning' not in sys.modules; "
        "from streamrec import Recommender; assert Recommender.__module__ == 'streamrec.api'; "
        "from translate import Translator; assert Translator.__module__ == 'translate.api'; "
        "assert 'lightning' not in sys.modules, sorted(m for m in sys.modules if 'lightning' in m)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
