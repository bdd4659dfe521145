"""The Jinja environments the backends render through, with their compiled templates on disk.

Compiling a template (building a lexer from a few dozen regular expressions, lexing, parsing,
generating and compiling Python) is paid by every process's first render, and gives the same
code every time.  :class:`DiskBytecodeCache` keeps that code in :mod:`kernforge.runtime.code_cache`
(content-keyed, tiered as the JIT cache, corrupt entries ignored).  Jinja's own
``FileSystemBytecodeCache`` is not used: it names an entry by the template's name and file only
(the source's checksum is checked inside it, so two versions of a template -- two branches --
keep overwriting one entry), ignores the environment's syntax options (``trim_blocks`` changes
the compiled code), writes a single directory, and checks no digest (an entry cut in its header
raises, one corrupted in its code can load).
"""
from __future__ import annotations

import jinja2

from kernforge.runtime import code_cache

KIND = "jinja"


def _syntax(env: jinja2.Environment) -> tuple:
    """Every environment setting the compiled code of a template depends on."""
    def name(x):
        return None if x is None else getattr(x, "__qualname__", type(x).__qualname__)

    return (env.block_start_string, env.block_end_string, env.variable_start_string,
            env.variable_end_string, env.comment_start_string, env.comment_end_string,
            env.line_statement_prefix, env.line_comment_prefix, env.trim_blocks, env.lstrip_blocks,
            env.newline_sequence, env.keep_trailing_newline, env.optimized, env.is_async,
            env.autoescape if isinstance(env.autoescape, bool) else name(env.autoescape),
            name(env.finalize), name(env.code_generator_class), sorted(env.extensions))


class DiskBytecodeCache(jinja2.BytecodeCache):
    """A Jinja bytecode cache whose entries are keyed by the template's name, file, source text
    and the environment's syntax (:func:`_syntax`), and the Jinja version that compiled it."""

    @staticmethod
    def entry_key(bucket: jinja2.bccache.Bucket) -> str:
        return code_cache.key(KIND, jinja2.__version__, bucket.key, bucket.checksum, repr(_syntax(bucket.environment)))

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        bucket.code = code_cache.load_code(KIND, self.entry_key(bucket))

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        code_cache.store_code(KIND, self.entry_key(bucket), bucket.code)


_BYTECODE_CACHE = DiskBytecodeCache()


def environment(directory, **options) -> jinja2.Environment:
    """A strict (undefined names raise) Jinja environment over the templates in ``directory``,
    its compiled templates cached on disk; ``options`` are ``jinja2.Environment``'s."""
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(directory)), undefined=jinja2.StrictUndefined,
                              bytecode_cache=_BYTECODE_CACHE, **options)
