"""The TensorRT-LLM launcher without TensorRT-LLM: its error when the engine is missing, and, against a
recording fake of the 1.2 API (`LLM`, `llmapi.UserProvidedDecodingConfig`, `serve.OpenAIServer`), what it
passes to the engine."""

from __future__ import annotations

import argparse
import importlib
import sys
import types
from pathlib import Path

import pytest

from spec_plugins.trtllm import launcher

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "trtllm"


class Recorder:
    """Keeps its constructor's keyword arguments."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs


class FakeLLM(Recorder):
    instances: list = []

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        FakeLLM.instances.append(self)


class FakeUserProvidedDecodingConfig(Recorder):
    pass


class FakeOpenAIServer:
    """tensorrt_llm.serve.OpenAIServer as 1.2 declares it."""

    instances: list = []

    def __init__(self, llm, model, tool_parser, server_role, metadata_server_cfg, disagg_cluster_config=None,
                 multimodal_server_config=None, chat_template=None):
        self.args = dict(llm=llm, model=model, tool_parser=tool_parser, server_role=server_role,
                         metadata_server_cfg=metadata_server_cfg, disagg_cluster_config=disagg_cluster_config,
                         multimodal_server_config=multimodal_server_config, chat_template=chat_template)
        self.served_at = None
        FakeOpenAIServer.instances.append(self)

    async def __call__(self, host, port, sockets=None):
        self.served_at = (host, port)


class FakeDrafter(Recorder):
    pass


class FakeResourceManager:
    def __init__(self, drafter):
        self.drafter = drafter


@pytest.fixture
def fake_trtllm(monkeypatch):
    """A `tensorrt_llm` 1.2.1 of recording fakes; our drafter module patched (or faked if not written yet)."""
    FakeLLM.instances.clear()
    FakeOpenAIServer.instances.clear()
    root = types.ModuleType("tensorrt_llm")
    root.__version__ = "1.2.1"
    root.LLM = FakeLLM
    llmapi = types.ModuleType("tensorrt_llm.llmapi")
    llmapi.UserProvidedDecodingConfig = FakeUserProvidedDecodingConfig
    serve = types.ModuleType("tensorrt_llm.serve")
    serve.OpenAIServer = FakeOpenAIServer
    root.llmapi, root.serve = llmapi, serve
    for name, module in [("tensorrt_llm", root), ("tensorrt_llm.llmapi", llmapi), ("tensorrt_llm.serve", serve)]:
        monkeypatch.setitem(sys.modules, name, module)
    try:
        drafters = importlib.import_module("spec_plugins.trtllm.drafter")
    except ImportError:
        drafters = types.ModuleType("spec_plugins.trtllm.drafter")
        monkeypatch.setitem(sys.modules, "spec_plugins.trtllm.drafter", drafters)
    # Through __dict__: the real module resolves these names lazily (importing TensorRT-LLM) on getattr.
    monkeypatch.setitem(drafters.__dict__, "SpecPluginsDrafter", FakeDrafter)
    monkeypatch.setitem(drafters.__dict__, "SpecPluginsResourceManager", FakeResourceManager)
    return root


@pytest.fixture
def llama_dir(tmp_path, monkeypatch):
    """A served model's folder as TensorRT-LLM gets it: its config.json (a Llama-3.1-8B shape), no weights needed
    here. Hub lookups are off, so a name that is no folder fails at once instead of waiting on the network."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "config.json").write_text((CONFIGS.parent / "models" / "llama-3.1-8b.json").read_text())
    return str(tmp_path)


def test_missing_trtllm_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)  # import fails as on a machine without it
    with pytest.raises(RuntimeError) as err:
        launcher.build_llm("some/model", CONFIGS / "suffix_tree-adaptive.yaml")
    msg = str(err.value)
    assert "\n" not in msg
    assert "TensorRT-LLM 1.2 or newer is needed" in msg and "pypi.nvidia.com" in msg and "CUDA" in msg


def test_too_old_trtllm_is_refused(fake_trtllm):
    fake_trtllm.__version__ = "1.1.0"
    with pytest.raises(RuntimeError, match=r"tensorrt_llm 1\.1\.0 is installed\. TensorRT-LLM 1\.2 or newer"):
        launcher.build_llm("m", CONFIGS / "native-ngram.yaml")


def test_our_section_becomes_a_user_provided_drafter(fake_trtllm, llama_dir):
    llm = launcher.build_llm(llama_dir, CONFIGS / "suffix_tree-adaptive.yaml")
    assert llm is FakeLLM.instances[-1]
    assert set(llm.kwargs) == {"model", "speculative_config", "disable_overlap_scheduler"}
    assert llm.kwargs["model"] == llama_dir
    assert llm.kwargs["disable_overlap_scheduler"] is True
    config = llm.kwargs["speculative_config"]
    assert isinstance(config, FakeUserProvidedDecodingConfig)
    import yaml

    schedule = yaml.safe_load((CONFIGS / "suffix_tree-adaptive.yaml").read_text())["speculative_config"]["draft_len_schedule"]
    assert schedule[1] == 16  # the planner's H200 plan: one range of K = 16
    drafter = config.kwargs["drafter"]
    assert isinstance(drafter, FakeDrafter)
    assert drafter.kwargs == {
        "max_draft_len": 16, "proposer": "suffix_tree",
        "proposer_options": {"max_depth": 24, "max_cached_requests": 10000, "append_ahead": True},
        "policy": "adaptive", "policy_options": {},
        "draft_len_schedule": schedule, "max_concurrency": None,
    }
    assert config.kwargs["max_draft_len"] == 16 and config.kwargs["draft_len_schedule"] == schedule
    assert "decoding_type" not in config.kwargs
    assert config.kwargs["resource_manager"].drafter is drafter


def test_overlap_scheduler_is_forced_off_and_trtllm_keys_pass_untouched(fake_trtllm, tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(
        "# engine: tensorrt-llm>=1.2\n"
        "speculative_config: {decoding_type: UserProvided, max_draft_len: 4, max_concurrency: 32}\n"
        "kv_cache_config: {free_gpu_memory_fraction: 0.8, enable_block_reuse: false}\n"
        "max_batch_size: 64\n"
        "spec_plugins: {proposer: ngram, proposer_options: {max_ngram: 3}}\n")
    llm = launcher.build_llm("m", path, max_seq_len=4096)
    assert llm.kwargs["kv_cache_config"] == {"free_gpu_memory_fraction": 0.8, "enable_block_reuse": False}
    assert llm.kwargs["max_batch_size"] == 64 and llm.kwargs["max_seq_len"] == 4096
    assert llm.kwargs["disable_overlap_scheduler"] is True
    config = llm.kwargs["speculative_config"]
    assert config.kwargs["max_concurrency"] == 32 and "draft_len_schedule" not in config.kwargs
    assert config.kwargs["drafter"].kwargs["max_concurrency"] == 32
    assert config.kwargs["drafter"].kwargs["draft_len_schedule"] is None
    assert config.kwargs["drafter"].kwargs["policy"] == "fixed"


def test_native_config_goes_through_unchanged(fake_trtllm):
    llm = launcher.build_llm("m", CONFIGS / "native-ngram.yaml")
    assert llm.kwargs == {
        "model": "m", "disable_overlap_scheduler": True,
        "speculative_config": {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 2,
                               "is_keep_all": True, "is_use_oldest": True, "is_public_pool": True},
    }


def test_yaml_mappings_become_config_objects_where_trtllm_has_the_helper(fake_trtllm, monkeypatch, llama_dir):
    calls = []

    def update_llm_args_with_extra_dict(llm_args, llm_args_dict, extra_llm_api_options=None):
        calls.append(dict(llm_args_dict))
        return {**llm_args, **{k: ("converted", v) if isinstance(v, dict) else v for k, v in llm_args_dict.items()}}

    fake_trtllm.llmapi.__path__ = []  # a package, so its submodule imports
    utils = types.ModuleType("tensorrt_llm.llmapi.llm_utils")
    utils.update_llm_args_with_extra_dict = update_llm_args_with_extra_dict
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi.llm_utils", utils)
    native = launcher.build_llm("m", CONFIGS / "native-ngram.yaml")
    assert native.kwargs["speculative_config"][0] == "converted"
    ours = launcher.build_llm(llama_dir, CONFIGS / "ngram-adaptive.yaml")
    assert "speculative_config" not in calls[-1]  # the UserProvided marker never reaches TensorRT-LLM's parser
    assert isinstance(ours.kwargs["speculative_config"], FakeUserProvidedDecodingConfig)


def test_adaptive_without_the_served_models_config_is_one_line(fake_trtllm, llama_dir, tmp_path):
    with pytest.raises(ValueError, match=r"^spec_plugins.policy_options.model_config: the served model's config.json "
                                         r"was not found for '/no/such/model'") as exc:
        launcher.build_llm("/no/such/model", CONFIGS / "suffix_tree-adaptive.yaml")
    assert "\n" not in str(exc.value)
    named = tmp_path / "named.yaml"  # the same section naming the model's shape: no config.json needed
    named.write_text((CONFIGS / "suffix_tree-adaptive.yaml").read_text().replace(
        "  policy: adaptive", "  policy_options: {model_config: llama-3.1-8b}\n  policy: adaptive"))
    assert launcher.build_llm("/no/such/model", named).kwargs["speculative_config"].kwargs["drafter"].kwargs[
        "policy_options"] == {"model_config": "llama-3.1-8b"}


def test_the_config_is_checked_against_the_installed_version(fake_trtllm):
    with pytest.raises(ValueError, match=r"'DFlash' does not exist in TensorRT-LLM 1\.2\.1 \(it needs 1\.3\+\)"):
        launcher.build_llm("m", CONFIGS / "native-dflash.yaml")
    fake_trtllm.__version__ = "1.3.0rc20"
    assert launcher.build_llm("m", CONFIGS / "native-dflash.yaml").kwargs["speculative_config"]["decoding_type"] == "DFlash"


def test_serve_builds_the_1_2_openai_server(fake_trtllm, llama_dir):
    launcher.serve(llama_dir, CONFIGS / "ngram-adaptive.yaml", host="0.0.0.0", port=8123)
    server = FakeOpenAIServer.instances[-1]
    assert server.args["llm"] is FakeLLM.instances[-1]
    assert server.args["model"] == llama_dir
    assert server.args["tool_parser"] is None and server.args["server_role"] is None
    assert server.served_at == ("0.0.0.0", 8123)


def test_server_kwargs_follow_the_constructor():
    class Newer:  # 1.3+: the engine argument is `generator`
        def __init__(self, generator, model, tool_parser, server_role, metadata_server_cfg,
                     disagg_cluster_config=None, multimodal_server_config=None, chat_template=None):
            pass

    class Older:
        def __init__(self, llm, model, server_role, metadata_server_cfg, disagg_cluster_config=None):
            pass

    assert set(launcher.server_kwargs(Newer, "E", "m")) == {
        "generator", "model", "tool_parser", "server_role", "metadata_server_cfg", "disagg_cluster_config",
        "multimodal_server_config", "chat_template"}
    assert launcher.server_kwargs(Older, "E", "m") == {"llm": "E", "model": "m", "server_role": None,
                                                        "metadata_server_cfg": None, "disagg_cluster_config": None}


def _parse(argv):
    parser = argparse.ArgumentParser(prog="spec-plugins")
    launcher.add_trtllm_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_serve_command(fake_trtllm, llama_dir):
    args = _parse(["trtllm", "serve", llama_dir, "--config", str(CONFIGS / "suffix_tree-adaptive.yaml"),
                   "--port", "9000"])
    assert (args.host, args.port) == ("localhost", 9000)
    args.func(args)
    assert FakeOpenAIServer.instances[-1].served_at == ("localhost", 9000)
    with pytest.raises(SystemExit):
        _parse(["trtllm", "serve", "/models/llama"])  # --config is required


def test_serve_command_without_trtllm_fails_with_the_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)
    args = _parse(["trtllm", "serve", "m", "--config", str(CONFIGS / "native-ngram.yaml")])
    with pytest.raises(RuntimeError, match="TensorRT-LLM 1.2 or newer is needed"):
        args.func(args)
