"""Environment precedence and parsing (all in kernforge.runtime.config)."""

import os

import pytest

from kernforge.runtime import config
from kernforge.runtime.errors import ConfigError


def env(**values):
    return dict(values, HOME="/home/u")


def test_defaults_use_home_cache():
    cfg = config.Config.from_env(env())
    assert cfg.cache_dirs == ("/home/u/.cache/kernforge",)
    assert cfg.cxx is None and cfg.verbose is False and cfg.lock_timeout_s == 600.0


def test_cache_dir_colon_list_keeps_order():
    cfg = config.Config.from_env(env(KERNFORGE_CACHE_DIR="/a:/b:rel"))
    assert cfg.cache_dirs == ("/a", "/b", "rel")


@pytest.mark.parametrize("value", ["", ":a", "a:", "a::b"])
def test_cache_dir_empty_element_is_rejected(value):
    with pytest.raises(ConfigError, match="empty path"):
        config.Config.from_env(env(KERNFORGE_CACHE_DIR=value))


def test_missing_home_without_cache_dir_is_an_error():
    with pytest.raises(ConfigError, match="HOME"):
        config.Config.from_env({"HOME": ""})


def test_app_prefix_overrides_global_which_overrides_default():
    values = env(KERNFORGE_JIT_CXX="/global/g++", MYAPP_JIT_CXX="/app/g++", KERNFORGE_JIT_VERBOSE="1")
    assert config.Config.from_env(values).cxx == "/global/g++"
    config.set_app_prefix("MYAPP")
    try:
        cfg = config.Config.from_env(values)
        assert cfg.cxx == "/app/g++"
        assert cfg.verbose is True  # not set under MYAPP: falls through to KERNFORGE
        cfg = config.Config.from_env(dict(values, MYAPP_JIT_VERBOSE="no"))
        assert cfg.verbose is False  # an explicit false shadows the global true
        cfg = config.Config.from_env(dict(values, MYAPP_JIT_CACHE_DIR="/app/cache", KERNFORGE_CACHE_DIR="/g"))
        assert cfg.cache_dirs == ("/app/cache",)
    finally:
        config.set_app_prefix(None)


def test_unprefixed_names_are_ignored():
    assert config.Config.from_env(env(JIT_CXX="/x", CXX="/y")).cxx is None


@pytest.mark.parametrize("text,expected", [("true", True), ("YES", True), ("False", False), ("no", False),
                                           ("0", False), ("2", True), ("-1", True)])
def test_bool_spellings(text, expected):
    assert config.Config.from_env(env(KERNFORGE_JIT_VERBOSE=text)).verbose is expected


@pytest.mark.parametrize("text", ["", "maybe", "1.5", " "])
def test_bad_bool_names_the_variable(text):
    with pytest.raises(ConfigError, match="KERNFORGE_JIT_VERBOSE"):
        config.Config.from_env(env(KERNFORGE_JIT_VERBOSE=text))


def test_empty_compiler_variable_is_an_error_not_a_default():
    with pytest.raises(ConfigError, match="KERNFORGE_JIT_CXX is set but empty"):
        config.Config.from_env(env(KERNFORGE_JIT_CXX=""))


def test_sizes_and_timeouts_parse():
    cfg = config.Config.from_env(env(KERNFORGE_JIT_CACHE_SIZE_LIMIT="3M", KERNFORGE_JIT_LOCK_TIMEOUT="2.5"))
    assert cfg.cache_size_limit == 3 << 20 and cfg.lock_timeout_s == 2.5
    with pytest.raises(ConfigError):
        config.Config.from_env(env(KERNFORGE_JIT_CACHE_SIZE_LIMIT="lots"))
    with pytest.raises(ConfigError):
        config.Config.from_env(env(KERNFORGE_JIT_LOCK_TIMEOUT="-1"))


@pytest.mark.parametrize("prefix", ["", "lower", "KERNFORGE", "1ABC"])
def test_bad_app_prefix(prefix):
    with pytest.raises(ConfigError):
        config.set_app_prefix(prefix)
