"""The exception classes of amdsmi (py-interface/amdsmi_exception.py): same names, bases,
constructor arguments, attributes and messages as ROCm/amdsmi 6.x-7.x."""

from __future__ import annotations

from . import amdsmi_wrapper

_ERROR_INFO = {
    amdsmi_wrapper.AMDSMI_STATUS_INVAL: "AMDSMI_STATUS_INVAL - Invalid parameters",
    amdsmi_wrapper.AMDSMI_STATUS_NOT_SUPPORTED: "AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
    amdsmi_wrapper.AMDSMI_STATUS_NOT_YET_IMPLEMENTED: "AMDSMI_STATUS_NOT_YET_IMPLEMENTED - Feature not yet implemented",
    amdsmi_wrapper.AMDSMI_STATUS_FAIL_LOAD_MODULE: "AMDSMI_STATUS_FAIL_LOAD_MODULE - Fail to load lib",
    amdsmi_wrapper.AMDSMI_STATUS_DRM_ERROR: "AMDSMI_STATUS_DRM_ERROR - Error when called libdrm",
    amdsmi_wrapper.AMDSMI_STATUS_API_FAILED: "AMDSMI_STATUS_API_FAILED - API call failed",
    amdsmi_wrapper.AMDSMI_STATUS_TIMEOUT: "AMDSMI_STATUS_TIMEOUT - Timeout in API call",
    amdsmi_wrapper.AMDSMI_STATUS_RETRY: "AMDSMI_STATUS_RETRY - Retry operation",
    amdsmi_wrapper.AMDSMI_STATUS_NO_PERM: "AMDSMI_STATUS_NO_PERM - Permission Denied",
    amdsmi_wrapper.AMDSMI_STATUS_IO: "AMDSMI_STATUS_IO - I/O Error",
    amdsmi_wrapper.AMDSMI_STATUS_FILE_ERROR: "AMDSMI_STATUS_FILE_ERROR - Error opening file",
    amdsmi_wrapper.AMDSMI_STATUS_INIT_ERROR: "AMDSMI_STATUS_INIT_ERROR - Initialization error",
    amdsmi_wrapper.AMDSMI_STATUS_BUSY: "AMDSMI_STATUS_BUSY - Device busy",
    amdsmi_wrapper.AMDSMI_STATUS_NOT_FOUND: "AMDSMI_STATUS_NOT_FOUND - Device Not found",
    amdsmi_wrapper.AMDSMI_STATUS_NOT_INIT: "AMDSMI_STATUS_NOT_INIT - Device not initialized",
    amdsmi_wrapper.AMDSMI_STATUS_DRIVER_NOT_LOADED: "AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded",
    amdsmi_wrapper.AMDSMI_STATUS_NO_DATA: "AMDSMI_STATUS_NO_DATA - No data was found for given input",
    amdsmi_wrapper.AMDSMI_STATUS_UNEXPECTED_DATA: "AMDSMI_STATUS_UNEXPECTED_DATA - The data read or provided was unexpected",
    amdsmi_wrapper.AMDSMI_STATUS_FILE_NOT_FOUND: "AMDSMI_STATUS_FILE_NOT_FOUND - File or directory not found",
    amdsmi_wrapper.AMDSMI_STATUS_UNKNOWN_ERROR: "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred",
}


class AmdSmiException(Exception):
    """Base smi exception class"""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        self.set_err_info()

    def __str__(self) -> str:
        return f"Error code:\n\t{self.err_code} | {self.err_info}"

    def get_error_info(self, detailed: bool = True) -> str:
        return self.err_info if detailed else str(self.err_info).split(" - ")[0]

    def get_error_code(self) -> int:
        return self.err_code

    def set_err_info(self) -> None:
        self.err_info = _ERROR_INFO.get(self.err_code, "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred")


class AmdSmiRetryException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(amdsmi_wrapper.AMDSMI_STATUS_RETRY)


class AmdSmiTimeoutException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(amdsmi_wrapper.AMDSMI_STATUS_TIMEOUT)


class AmdSmiParameterException(AmdSmiException):
    def __init__(self, receivedValue: object, expectedType: object, msg: str | None = None) -> None:  # noqa: N803
        super().__init__(msg)
        self.err_code = None
        self.actualType = type(receivedValue)
        self.expectedType = expectedType
        self.err_msg = (
            ("Invalid parameter:\n" + f"Actual type: {self.actualType}\n" + f"Expected type: {self.expectedType}")
            if msg is None
            else msg
        )

    def __str__(self) -> str:
        return self.err_msg


class AmdSmiKeyException(AmdSmiException):
    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self.err_msg = "Key " + self.key + " is missing from dictionary"

    def __str__(self) -> str:
        return self.err_msg


class AmdSmiBdfFormatException(AmdSmiException):
    def __init__(self, bdf: str) -> None:
        super().__init__()
        self.bdf = bdf

    def __str__(self) -> str:
        return f"Wrong BDF format: {self.bdf}. \nBDF string should be: <domain>:<bus>:<device>.<function>"
