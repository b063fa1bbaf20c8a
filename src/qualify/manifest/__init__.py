"""The release manifest: its model (`model`), loading with one line per problem (`load`), the test matrix it
expands to (`cases`) and what makes two results comparable (`fingerprint`). The model's names are
re-exported here: `from qualify.manifest import ReleaseManifest`."""

from qualify.manifest.model import *  # noqa: F401,F403 - the model is the package's face
from qualify.manifest.model import __all__  # noqa: F401
