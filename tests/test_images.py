"""Wrapper-image distribution between real node engines on the testbed."""

from __future__ import annotations

import contextlib

import pytest
from python_on_whales import DockerClient

from generator import config, images, output, render
from tests import images as test_images
from tests.testbed import IFNAME, MODELS, Testbed

pytestmark = pytest.mark.testbed


def test_a_node_without_the_base_gets_the_wrapper_streamed_and_then_nothing_moves(
    testbed: Testbed, tmp_path
) -> None:
    first, second = testbed.nodes[:2]
    base = test_images.debian_base(DockerClient())
    testbed.load_image(base)
    cluster = config.parse(
        f"name: dist\nimage: {base}\naccelerator: none\ninterface: {IFNAME}\nbackend: native\n"
        f"nodes: [{{name: a, ip: {first.ip}, context: {first.context}}},"
        f" {{name: b, ip: {second.ip}, context: {second.context}}}]\n"
        f"model: {{path: {MODELS}}}\n"
    )
    output.apply(output.plan(render.render(cluster, "dist.yaml"), tmp_path))
    tag = render.wrapper_tag(cluster)
    for node in (first, second):
        with contextlib.suppress(Exception):
            node.docker.image.remove(tag, force=True)
    second.docker.image.remove(base, force=True)  # b cannot get the base: no registry here

    targets = [
        images.Target("a", first.docker, tmp_path / "a"),
        images.Target("b", second.docker, tmp_path / "b"),
    ]
    progress: list[str] = []
    assert images.distribute(targets, tag, base, progress.append) == {"a": "built", "b": "streamed"}
    assert first.docker.image.inspect(tag).id == second.docker.image.inspect(tag).id
    assert progress[-1].startswith(f"image: {tag} streamed a -> b (")

    progress.clear()
    assert images.distribute(targets, tag, base, progress.append) == {
        "a": "present",
        "b": "present",
    }
    assert progress == []
