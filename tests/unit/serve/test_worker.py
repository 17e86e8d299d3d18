"""The decode worker's pure parts (tr_cli/serve/worker.py); the worker itself is exercised over
HTTP in tests/integration/test_serve.py."""

from tr_cli.serve.worker import retry_after_seconds


def test_retry_after_is_the_running_jobs_expected_rest():
    assert retry_after_seconds([0.3, 0.25, 0.35], running_for=0.1) == 1  # short jobs: a second, not 9
    assert retry_after_seconds([20.0, 30.0, 22.0], running_for=5.0) == 17  # the median, less what has run
    assert retry_after_seconds([4.0], running_for=9.0) == 1  # running past the usual: soon, never 0


def test_retry_after_without_history_guesses_from_the_running_job():
    assert retry_after_seconds([], running_for=6.0) == 6  # as long again as it has run
    assert retry_after_seconds([], running_for=None) == 1  # nothing runs yet
