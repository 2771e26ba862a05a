"""The operations, one module per thing a command does: deploy, upgrade, watch, preflight, lock,
sync and verify, bench and check, top, status and diagnose. Below them: base, config, stack, nodes;
above them only generator/cli."""
