"""What the API imports in the background as it starts, so that the first request for a
model registered later does not wait for it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_preloading_imports_what_loading_a_tokenizer_needs_and_start_up_does_not() -> None:
    code = (
        "import sys\n"
        "import api.main\n"
        "from inferq.wire import prompts\n"
        "assert 'transformers' not in sys.modules, 'the API imports transformers at start'\n"
        "prompts.preload()\n"
        "assert 'transformers.models.auto.tokenization_auto' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_tokenizer_loads_while_the_preload_runs(tiny_model: Path) -> None:
    code = (
        "import sys, threading\n"
        "from inferq.wire import prompts\n"
        "preloading = threading.Thread(target=prompts.preload)\n"
        "preloading.start()\n"
        "renderer = prompts.PromptRenderer.load(sys.argv[1], max_model_len=None)\n"
        "preloading.join()\n"
        "assert renderer.vocab_size > 0 and renderer.context_len > 0\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tiny_model)], check=True, timeout=120)
