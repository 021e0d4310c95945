"""The configuration: defaults.py (every key; a component's own keys are declared beside it, runner.keys),
derived.py (what a value means at run time), schema.py (what each accepts), validation.py (`validate`: those
rules and the cross-field ones on a merged config), safe_yaml.py (YAML text to entries with file:line), merge.py
(entries onto a config), compare.py (flatten, diff), dump.py (config to YAML), key_help.py (--help-keys,
did-you-mean), output_dir.py (the default run folder), imports.py (IMPORTS: the user's code), loader.py (argv,
files, overrides, provenance). Imports run one way: defaults, derived <- schema <- validation, compare, dump,
safe_yaml, key_help, output_dir <- merge <- loader, and imports <- merge."""
from runner.config.compare import MISSING, changed_from_defaults, diff_configs, flatten, same_value
from runner.config.defaults import get_default_config
from runner.config.dump import dump_config
from runner.config.loader import (
    ConfigInfo,
    add_config_arguments,
    build_parser,
    config_command,
    handle_info_flags,
    load_config,
)
from runner.config.merge import config_from_yaml_text
from runner.config.output_dir import default_output_dir
from runner.config.schema import (
    ENUMS,
    OPTIMIZERS,
    RESUME_SAFE_KEYS,
    UNSUPPORTED_OPTIMIZERS,
    coerce_value,
)
from runner.config.validation import validate

__all__ = [
    "ENUMS", "MISSING", "OPTIMIZERS", "RESUME_SAFE_KEYS", "UNSUPPORTED_OPTIMIZERS", "ConfigInfo",
    "add_config_arguments", "build_parser", "changed_from_defaults", "coerce_value", "config_command",
    "config_from_yaml_text", "default_output_dir", "diff_configs", "dump_config", "flatten", "get_default_config",
    "handle_info_flags", "load_config", "same_value", "validate",
]
