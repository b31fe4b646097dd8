"""Settings for every tierpoint process, from environment variables and an optional TOML file.

Tiers are configuration, not code: the ordered list goes from the fastest, most local tier to the
most durable one (each one's options: tierpoint.tier_config). A RAM tier is a `local` tier rooted
on /dev/shm.
"""

from __future__ import annotations

import os
import re
from typing import Any

from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from tierpoint.config.api import ApiSettings
from tierpoint.config.data_endpoint import DataEndpointSettings
from tierpoint.config.observability import ObservabilitySettings
from tierpoint.config.services import ServicesSettings
from tierpoint.config.tiers import TiersSettings
from tierpoint.config.workflows import WorkflowSettings


# One class per concept (this package's modules); each section owns the checks of its own
# settings. Listed last-first: pydantic orders the fields from the last base to the first, and
# the order is that of docs/configuration.md and `tierpoint config`.
class Settings(
    ObservabilitySettings,
    DataEndpointSettings,
    WorkflowSettings,
    ApiSettings,
    TiersSettings,
    ServicesSettings,
    BaseSettings,
):
    model_config = SettingsConfigDict(
        env_prefix="TIERPOINT_",
        env_nested_delimiter="__",
        toml_file=os.environ.get("TIERPOINT_CONFIG_FILE", "tierpoint.toml"),
        extra="ignore",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))

    def public_dict(self) -> dict[str, Any]:
        """Settings safe to print: no credentials in URLs."""
        data = self.model_dump(mode="json")
        data["database_url"] = re.sub(r"//([^:@/]+):[^@/]*@", r"//\1:***@", self.database_url)
        return data
