"""API errors (tr_cli/serve/errors.py): the status, headers and OpenAI error object each carries."""

from tr_cli.serve.errors import ApiError, server_error, unavailable


def test_a_request_error_is_an_invalid_request_by_default():
    error = ApiError(400, "n: only 1 choice", param="n")
    assert (error.status, error.headers, str(error)) == (400, {}, "n: only 1 choice")
    assert error.body() == {
        "error": {"message": "n: only 1 choice", "type": "invalid_request_error", "param": "n", "code": None}
    }


def test_type_code_and_headers_are_carried():
    error = ApiError(429, "busy", type="rate_limit_error", code="queue_full", headers={"Retry-After": "3"})
    assert error.body()["error"] == {"message": "busy", "type": "rate_limit_error", "param": None, "code": "queue_full"}
    assert error.headers == {"Retry-After": "3"}


def test_server_error_is_a_500_of_type_server_error():
    error = server_error("decode failed")
    assert error.status == 500 and error.body()["error"]["type"] == "server_error" and error.headers == {}


def test_unavailable_is_a_503_that_says_when_to_retry_if_known():
    later = unavailable("shutting down", retry_after=5)
    assert later.status == 503 and later.headers == {"Retry-After": "5"}
    assert later.body()["error"] == {
        "message": "shutting down",
        "type": "server_error",
        "param": None,
        "code": "unavailable",
    }
    assert unavailable("shutting down").headers == {}
