"""Store: the tables and their migrations, the connection (SQLite file or PostgreSQL), and
the hand-written statements of the queue's hot path. Times are Unix seconds (float) on
both databases; the API renders them as ISO 8601. Callers use the names below."""

from .connection import (
    CONNECTION_DEFAULTS as CONNECTION_DEFAULTS,
)
from .connection import (
    OUTAGE_ERRORS as OUTAGE_ERRORS,
)
from .connection import (
    POOL_SIZE as POOL_SIZE,
)
from .connection import (
    RETRY_DELAYS as RETRY_DELAYS,
)
from .connection import (
    SqliteFile as SqliteFile,
)
from .connection import (
    after_outage as after_outage,
)
from .connection import (
    application_name as application_name,
)
from .connection import (
    close_connection as close_connection,
)
from .connection import (
    connect as connect,
)
from .connection import (
    disk_full as disk_full,
)
from .connection import (
    file_replaced as file_replaced,
)
from .connection import (
    open_database as open_database,
)
from .connection import (
    postgres as postgres,
)
from .connection import (
    queue_id as queue_id,
)
from .connection import (
    release_connection as release_connection,
)
from .connection import (
    retried as retried,
)
from .connection import (
    safe_url as safe_url,
)
from .connection import (
    sqlite as sqlite,
)
from .connection import (
    sqlite_file as sqlite_file,
)
from .migrations import MIGRATIONS as MIGRATIONS
from .migrations import SchemaVersion as SchemaVersion
from .migrations import migrate as migrate
from .schema import (
    ACTIVE_STATES as ACTIVE_STATES,
)
from .schema import (
    FINAL_STATES as FINAL_STATES,
)
from .schema import (
    MODELS as MODELS,
)
from .schema import (
    PRIORITIES as PRIORITIES,
)
from .schema import (
    PRIORITY_NAMES as PRIORITY_NAMES,
)
from .schema import (
    RUN_DONE as RUN_DONE,
)
from .schema import (
    BaseModel as BaseModel,
)
from .schema import (
    FileState as FileState,
)
from .schema import (
    Job as Job,
)
from .schema import (
    JobLog as JobLog,
)
from .schema import (
    JobStatus as JobStatus,
)
from .schema import (
    JSONField as JSONField,
)
from .schema import (
    MediaFile as MediaFile,
)
from .schema import (
    Node as Node,
)
from .schema import (
    NotJSON as NotJSON,
)
from .schema import (
    ProcessorRun as ProcessorRun,
)
from .schema import (
    QueueState as QueueState,
)
from .schema import (
    ResultPart as ResultPart,
)
from .schema import (
    RunStatus as RunStatus,
)
from .schema import (
    SearchEntry as SearchEntry,
)
from .schema import (
    SearchIndexed as SearchIndexed,
)
from .schema import (
    SearchVector as SearchVector,
)
from .schema import (
    fingerprint as fingerprint,
)
from .schema import (
    stamp as stamp,
)
from .schema import (
    to_json as to_json,
)
from .schema import (
    unchanged as unchanged,
)
from .schema import (
    utf8 as utf8,
)
from .schema import (
    written as written,
)
from .sql import (
    execute as execute,
)
from .sql import (
    fetch as fetch,
)
from .sql import (
    holds_cluster_lock as holds_cluster_lock,
)
from .sql import (
    insert as insert,
)
from .sql import (
    insert_many as insert_many,
)
from .sql import (
    is_postgres as is_postgres,
)
from .sql import (
    read_snapshot as read_snapshot,
)
from .sql import (
    rows as rows,
)
from .sql import (
    write_transaction as write_transaction,
)
