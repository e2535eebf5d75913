"""User-file guards: a size cap and a YAML loader that refuses repeated keys (twin: models/yamlio.py)."""

import yaml

# Model specs, config.json, cluster, sweep and sharding files are kilobytes; refusing bigger ones before
# parsing bounds memory (a 58 MB spec used to reach 3.4 GB).
MAX_INPUT_BYTES = 8 * 2**20


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader refusing a key given twice in one mapping (PyYAML silently keeps the last)."""

    def construct_mapping(self, node, deep=False):
        lines: dict = {}
        for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else ():
            if isinstance(key_node, yaml.ScalarNode) and not key_node.tag.endswith(":merge"):
                key = self.construct_object(key_node)
                if key in lines:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first at line {lines[key]})", key_node.start_mark)
                lines[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)
