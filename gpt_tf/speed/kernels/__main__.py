"""``python -m gpt_tf.speed.kernels``: builds the fused CPU kernels now (scripts/setup.sh runs it) and says what runs."""

from gpt_tf.console import import_tensorflow, start_command


def main() -> int:
    start_command()
    import_tensorflow()
    from gpt_tf.speed import kernels

    line = kernels.status()
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
