"""What more than one test file uses; tests import it as `helpers.x` (pytest puts tests/ on sys.path,
conftest.py's folder, in its default `prepend` import mode), and no test imports another test.

- cli: `python -m arlecli` in a subprocess, the one-line-error and byte-identical checks, read_pty
- fake_openai, fake_judge: an OpenAI-compatible fake server and a stand-in judge on it
- tiny_model, tool_model, smollm2: models (a tiny random Qwen2, it with a tool template and a
  scripted tool call, the real embedded SmolLM2-135M)
- scripted_engine: engines that write fixed text as a model would
- runs: run directories written by hand and `arle data from-eval` in this process
- train: `arle train` in this process or a subprocess, the `test_varied` reward, checks on a run
- lmeval_local, chromium, game_players, game_solvers: lm-eval tasks on local rows, a headless
  browser, the game cards' players and solvers
"""
