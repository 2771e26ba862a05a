"""Wrapper-image distribution between real node engines on the testbed."""

from __future__ import annotations

import contextlib

import pytest
from python_on_whales import DockerClient

from generator import config, images, output, render
from tests import images as test_images
from tests.testbed import IFNAME, MODELS, Testbed

pytestmark = pytest.mark.testbed


def test_nodes_without_the_base_get_the_wrapper_streamed_at_once_and_then_nothing_moves(
    testbed: Testbed, tmp_path
) -> None:
    first, second, third = testbed.nodes
    base = test_images.debian_base(DockerClient())
    testbed.load_image(base)
    cluster = config.parse(
        f"name: dist\nimage: {base}\naccelerator: none\ninterface: {IFNAME}\nbackend: native\n"
        f"nodes: [{{name: a, ip: {first.ip}, context: {first.context}}},"
        f" {{name: b, ip: {second.ip}, context: {second.context}}},"
        f" {{name: c, ip: {third.ip}, context: {third.context}}}]\n"
        f"model: {{path: {MODELS}}}\n"
    )
    output.apply(output.plan(render.render(cluster, "dist.yaml"), tmp_path))
    tag = render.wrapper_tag(cluster)
    for node in (first, second, third):
        with contextlib.suppress(Exception):
            node.docker.image.remove(tag, force=True)
    for node in (second, third):  # b and c cannot get the base: no registry here
        node.docker.image.remove(base, force=True)

    targets = [
        images.Target("a", first.docker, tmp_path / "a"),
        images.Target("b", second.docker, tmp_path / "b"),
        images.Target("c", third.docker, tmp_path / "c"),
    ]
    progress: list[str] = []
    assert images.distribute(targets, tag, base, progress.append) == {
        "a": "built",
        "b": "streamed",
        "c": "streamed",
    }
    wanted = first.docker.image.inspect(tag).id
    assert second.docker.image.inspect(tag).id == wanted == third.docker.image.inspect(tag).id
    done = sorted(line.split(" (")[0] for line in progress if " streamed " in line)
    assert done == [f"image: {tag} streamed a -> b", f"image: {tag} streamed a -> c"]

    progress.clear()
    assert images.distribute(targets, tag, base, progress.append) == {
        "a": "present",
        "b": "present",
        "c": "present",
    }
    assert progress == []
