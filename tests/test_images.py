"""Wrapper-image distribution between real node engines on the testbed."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import pytest
from python_on_whales import DockerClient

from generator import config
from generator.nodes import images
from generator.stack import output, render
from tests.support import images as test_images
from tests.support.testbed import IFNAME, MODELS, Testbed

pytestmark = pytest.mark.testbed


def test_nodes_without_the_base_get_the_wrapper_streamed_at_once_and_then_nothing_moves(
    testbed: Testbed, tmp_path: Path
) -> None:
    first, second, third = testbed.nodes[:3]
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
    # One save on a, read once and loaded on b and c at once.
    done = [line.split(" (")[0] for line in progress if " streamed " in line]
    assert done == [f"image: {tag} streamed a -> b, c"]
    # Each node said as its engine finished loading.
    loaded = sorted(line.split(" (")[0] for line in progress if " loaded on " in line)
    assert loaded == [f"image: {tag} loaded on b", f"image: {tag} loaded on c"]

    progress.clear()
    assert images.distribute(targets, tag, base, progress.append) == {
        "a": "present",
        "b": "present",
        "c": "present",
    }
    assert progress == []


def only_env(base: str) -> str:
    """`base` with one more variable: a new image ID on the very same layers."""
    tag = "vllm-compose-test/only-env:1"
    with tempfile.TemporaryDirectory() as context:
        (Path(context) / "Dockerfile").write_text(f"FROM {base}\nENV REBUILT_WITH=env\n")
        DockerClient().legacy_build(context, tags=[tag])
    return tag


def test_a_base_changed_under_its_name_gets_its_wrapper_rebuilt_on_that_node(
    testbed: Testbed, tmp_path: Path
) -> None:
    """A re-pulled or rebuilt `:latest`: the same name, another image. The wrapper's tag follows
    the name, so the node's wrapper is checked against the base it finds there."""
    first, second = testbed.nodes[:2]
    old = test_images.debian_base(DockerClient())
    new = test_images.STANDIN  # loaded on every node by the fixture; built on another base
    moving = "vllm-compose-test/moving:latest"
    testbed.load_image(old, nodes=[first, second])
    for node in (first, second):
        node.docker.image.tag(old, moving)
    cluster = config.parse(
        f"name: moving\nimage: {moving}\naccelerator: none\ninterface: {IFNAME}\n"
        f"backend: native\nnodes: [{{name: a, ip: {first.ip}, context: {first.context}}},"
        f" {{name: b, ip: {second.ip}, context: {second.context}}}]\nmodel: {{path: {MODELS}}}\n"
    )
    output.apply(output.plan(render.render(cluster, "moving.yaml"), tmp_path))
    tag = render.wrapper_tag(cluster)
    targets = [
        images.Target("a", first.docker, tmp_path / "a"),
        images.Target("b", second.docker, tmp_path / "b"),
    ]
    try:
        for node in (first, second):
            with contextlib.suppress(Exception):
                node.docker.image.remove(tag, force=True)
        assert images.distribute(targets, tag, moving, print) == {"a": "built", "b": "built"}
        first.docker.image.tag(new, moving)  # `docker pull` brought a new :latest to node a
        assert images.distribute(targets, tag, moving, print) == {"a": "rebuilt", "b": "present"}
        layers = first.docker.image.inspect(tag).root_fs.layers or []
        base = first.docker.image.inspect(new).root_fs.layers or []
        assert layers[: len(base)] == base
        assert images.distribute(targets, tag, moving, print) == {"a": "present", "b": "present"}
        # A base rebuilt with only another ENV: no new layer, yet another image.
        testbed.load_image(only_env(old), nodes=[second])
        second.docker.image.tag(only_env(old), moving)
        assert images.distribute(targets, tag, moving, print) == {"a": "present", "b": "rebuilt"}
        assert "REBUILT_WITH=env" in (second.docker.image.inspect(tag).config.env or [])
    finally:
        for node in (first, second):
            with contextlib.suppress(Exception):
                node.docker.image.remove(tag, force=True)
            with contextlib.suppress(Exception):
                node.docker.image.remove(moving)
