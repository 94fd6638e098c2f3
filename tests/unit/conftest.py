"""Unit tests share one process: a stop request left by one test must not stop the next trial."""

import pytest

from hpcsweep.control import stop


@pytest.fixture(autouse=True)
def no_leftover_stop_request():
    stop.STOP_REQUESTED.clear()
    yield
    stop.STOP_REQUESTED.clear()


@pytest.fixture(scope="session")
def model_folders(tmp_path_factory):
    """Real pretrained model folders (``tests/model_folders.py``), made once for the session: ``single``
    (one model.safetensors) and ``sharded`` (an index and its shards), the same weights (seed 0).
    Never change them: copy one first."""
    from tests.model_folders import make_model_folder

    root = tmp_path_factory.mktemp("model-folders")
    return {
        "single": make_model_folder(root / "single"),
        "sharded": make_model_folder(root / "sharded", max_shard_size="100KB"),
    }
