from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.support.testbed import Testbed


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden", action="store_true", help="Rewrite tests/golden from the renderer."
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    """Four emulated nodes with their own engines, the Ray stand-in image, the front door's
    (tests/support/testbed.py) and the stand-in's model folder on each."""
    from python_on_whales import DockerClient

    from tests.support import clusters, images
    from tests.support.testbed import running

    image = images.standin_base(DockerClient())
    with running(4) as bed:
        bed.load_image(image)
        clusters.place_standin_model(bed)
        yield bed


@pytest.fixture(scope="session")
def vllm_testbed(testbed: Testbed) -> Testbed:
    """The testbed's first two nodes with the real-vLLM image and the tiny model on each."""
    from python_on_whales import DockerClient

    from tests.support import clusters, images

    root = DockerClient()
    image, model = images.vllm_base(root), images.tiny_model(root)
    clusters.place_vllm(testbed, image, model)
    return testbed
