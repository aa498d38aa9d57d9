"""Browser tests: the real ``jupyterhub-gpupool demo`` driven by headless Chromium (Playwright)."""
