from tests.console.browser import browser  # noqa: F401  (the module-scoped Chromium fixture)
