import time

from infra.progress import Reporter


def test_plain_lines_show_done_of_total_rate_and_what_is_left():
    lines: list[str] = []
    reporter = Reporter(terminal=False, interval_s=3600, write=lines.append)
    with reporter.task("kv: math", 8) as advance:
        for _ in range(8):
            advance(1)
            time.sleep(0.001)
    assert lines[0] == "kv: math: 0/8 items"
    middle = [line for line in lines[1:-1]]
    assert [line.split(",")[0] for line in middle] == ["kv: math: 2/8 items", "kv: math: 4/8 items",
                                                      "kv: math: 6/8 items"]
    assert all("items/s" in line and "left" in line for line in middle)
    assert lines[-1].startswith("kv: math: 8/8 items in ")


def test_plain_lines_come_at_least_every_interval_without_a_total():
    lines: list[str] = []
    reporter = Reporter(terminal=False, interval_s=0.0, write=lines.append)
    with reporter.task("capacity", None, unit="probes") as advance:
        advance(1)
        advance(1)
    assert lines[1].startswith("capacity: 1 probes") and lines[2].startswith("capacity: 2 probes")
    assert lines[-1].startswith("capacity: 2 probes in ")


def test_a_terminal_bar_leaves_one_summary_line(capsys):
    reporter = Reporter(terminal=True)
    with reporter.task("w8: code", 3) as advance:
        advance(3)
    assert "w8: code: 3/3 items in" in capsys.readouterr().err


def test_progress_lines_go_to_the_prefect_run_log_inside_a_task(capsys):
    import logging

    from prefect import flow, task

    from infra.progress import Reporter

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    @task(log_prints=False)
    def quiet() -> None:
        Reporter(terminal=False).line("inside the task")

    @flow
    def acceptance() -> None:
        quiet()

    handler = Keep()
    logging.getLogger("prefect.task_runs").addHandler(handler)
    try:
        acceptance()
    finally:
        logging.getLogger("prefect.task_runs").removeHandler(handler)
    assert "inside the task" in seen
    Reporter(terminal=False).line("outside any run")
    assert "outside any run" in capsys.readouterr().out
