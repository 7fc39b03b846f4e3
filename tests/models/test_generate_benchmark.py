"""benchmarks.generate in its CI size: every variant (sx2torch's cached decode eager and
compiled, transformers' generate eager and compiled static) makes transformers' eager tokens
and gets a line of tokens per second. No time is asserted: the machines are shared."""


def test_the_benchmark_runs_ci_sized_with_torch_compile(capsys):
    from benchmarks.generate import main

    main(["--ci"])  # exits with a message if a variant's tokens differ
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Llama ") and "4 new tokens" in lines[0]
    names = [line.split("  ")[0] for line in lines[1:]]
    assert names == [
        "sx2torch eager",
        "transformers eager",
        "sx2torch compiled",
        "transformers compiled",
    ]
    assert all(" tok/s" in line for line in lines[1:])
