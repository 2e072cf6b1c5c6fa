"""Jobs: the only package that changes job and processor-run state.

Every transition is one transaction and publishes one event after it commits. Callers use
the names below (``jobs.claim``, ``jobs.submit``); each lives in the module of its stage:
submit (taking requests), claims (the worker's side), runs, settings, callbacks, order.
"""

from .callbacks import (
    callback_delivered as callback_delivered,
)
from .callbacks import (
    claim_callback as claim_callback,
)
from .callbacks import (
    next_callback_due as next_callback_due,
)
from .callbacks import (
    owed_callbacks as owed_callbacks,
)
from .callbacks import (
    settle_callback as settle_callback,
)
from .claims import (
    ClaimRequest as ClaimRequest,
)
from .claims import (
    claim as claim,
)
from .claims import (
    finish as finish,
)
from .claims import (
    finish_and_claim as finish_and_claim,
)
from .claims import (
    get as get,
)
from .claims import (
    give_back as give_back,
)
from .claims import (
    heartbeat as heartbeat,
)
from .claims import (
    pending_runs as pending_runs,
)
from .claims import (
    reap as reap,
)
from .claims import (
    requeue as requeue,
)
from .claims import (
    same_content_under_way as same_content_under_way,
)
from .common import (
    LeaseLost as LeaseLost,
)
from .common import (
    RetryPolicy as RetryPolicy,
)
from .common import (
    file_uuid_of as file_uuid_of,
)
from .common import (
    find_job as find_job,
)
from .common import (
    parse_priority as parse_priority,
)
from .job_log import (
    keep_log as keep_log,
)
from .job_log import (
    other_nodes_log as other_nodes_log,
)
from .order import pending_in_order as pending_in_order
from .order import position as position
from .runs import (
    Claim as Claim,
)
from .runs import (
    Completion as Completion,
)
from .runs import (
    Started as Started,
)
from .runs import (
    complete_run as complete_run,
)
from .runs import (
    documented as documented,
)
from .runs import (
    fail_run as fail_run,
)
from .runs import (
    release_run as release_run,
)
from .runs import (
    report as report,
)
from .runs import (
    run_errors as run_errors,
)
from .runs import (
    skip_run as skip_run,
)
from .runs import (
    start_run as start_run,
)
from .runs import (
    stop_asked as stop_asked,
)
from .runs import (
    undocumented_failures as undocumented_failures,
)
from .settings import (
    init_queue_state as init_queue_state,
)
from .settings import (
    queue_state as queue_state,
)
from .settings import (
    set_concurrency as set_concurrency,
)
from .settings import (
    set_paused as set_paused,
)
from .submit import (
    answer_with_existing as answer_with_existing,
)
from .submit import (
    cancel as cancel,
)
from .submit import (
    clear as clear,
)
from .submit import (
    dismiss as dismiss,
)
from .submit import (
    hold as hold,
)
from .submit import (
    prioritize as prioritize,
)
from .submit import (
    release_hold as release_hold,
)
from .submit import (
    retry as retry,
)
from .submit import (
    set_priority as set_priority,
)
from .submit import (
    submit as submit,
)
from .submit import (
    submit_new as submit_new,
)
from .submit import (
    waiting_job as waiting_job,
)
