"""Stage ``normalize``: raw ``spans`` -> ``requests`` (one row per inference request).

Request spans are

* vLLM V1 ``llm_request`` spans (latencies and token counts in promoted ``gen_ai_*`` columns);
* spans following the OpenTelemetry GenAI conventions (token usage or ``gen_ai.operation.name``
  in the attribute map), kind SERVER or CLIENT, unless they are the parent of another request
  span (a client span around a server span is one request, counted once, at the server).

The simulator's (or a real) ``gateway_request`` span is not a request: it is the parent of the
engine span and gives the network/routing overhead, ``network_s`` = gateway span duration minus
engine span duration (each a difference on one clock). Except when it failed with no engine span
under it (an engine that was down, hung or refused: status ERROR, usually a 5xx): then it is the
only trace of the request, which is one failed request (``is_error``, ``source`` = ``gateway``,
no latency phases) on the engine it was routed to (``server.address``,
``fleetlens.instance_id``). vLLM start-up spans and every other span are not requests.
Duplicates (at-least-once delivery) are removed on (trace_id, span_id).
"""

from __future__ import annotations

import polars as pl

from fleetlens.pipeline.attrs import (
    extract_keys,
    extract_keys_distinct,
    first_string_of_key,
    per_value,
)
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.stage import stage

SOURCE_VLLM = "vllm"
SOURCE_GENAI = "genai"
SOURCE_GATEWAY = "gateway"
_SERVER, _CLIENT = 2, 3
_STATUS_ERROR = 2
_ERROR_FINISH_REASONS = ("abort", "error")
_NS = 1_000_000_000

# Internal column names (never written).
_RES_INSTANCE, _RES_MODEL = "__res_instance", "__res_model"
_ATTR_IN, _ATTR_OUT, _ATTR_CACHED = "__attr_in", "__attr_out", "__attr_cached"
_ATTR_CACHED_OLD = "__attr_cached_old"
_ATTR_OP, _ATTR_ERR, _ATTR_RESP_ID = "__attr_op", "__attr_err", "__attr_resp_id"
_ATTR_RESP_MODEL, _IS_VLLM, _MAP_MODEL = "__attr_resp_model", "__is_vllm", "__map_model"
_GW_ID, _GW_DUR = "__gw_span_id", "__gw_dur_ns"
_FINISH = "__finish"
_ATTR_SERVER, _ATTR_GW_INSTANCE, _IS_GW = "__attr_server", "__attr_gw_instance", "__is_gw"


def dedup_spans(spans: pl.DataFrame) -> pl.DataFrame:
    """Drop repeated deliveries: one row per (trace_id, span_id), the first in input order.

    Repeated deliveries carry the same span, so which copy survives does not matter; the input
    order (segments sorted by path) is the same in every run over the same segments.
    """
    # Usually there is nothing to remove: one 64-bit hash per row proves it in a third of the
    # time of the exact two-string unique, which runs only when two hashes collide.
    hashes = spans.select(pl.struct(c.TRACE_ID, c.SPAN_ID).hash()).to_series()
    if not hashes.is_duplicated().any():
        return spans
    return spans.unique([c.TRACE_ID, c.SPAN_ID], keep="first", maintain_order=True)


def _span_keys() -> dict[str, tuple[str, pl.DataType]]:
    return {
        a.GEN_AI_INPUT_TOKENS: (_ATTR_IN, pl.Int64()),
        a.GEN_AI_OUTPUT_TOKENS: (_ATTR_OUT, pl.Int64()),
        a.GEN_AI_CACHED_INPUT_TOKENS: (_ATTR_CACHED, pl.Int64()),
        a.GEN_AI_CACHED_INPUT_TOKENS_OLD: (_ATTR_CACHED_OLD, pl.Int64()),
        a.GEN_AI_OPERATION_NAME: (_ATTR_OP, pl.String()),
        a.ERROR_TYPE: (_ATTR_ERR, pl.String()),
        a.GEN_AI_RESPONSE_ID: (_ATTR_RESP_ID, pl.String()),
        a.GEN_AI_RESPONSE_MODEL: (_ATTR_RESP_MODEL, pl.String()),
        a.SERVER_ADDRESS: (_ATTR_SERVER, pl.String()),
        a.FLEETLENS_INSTANCE_ID: (_ATTR_GW_INSTANCE, pl.String()),
    }


def _resource_keys(dimensions: dict[str, str]) -> dict[str, tuple[str, pl.DataType]]:
    keys = {a.SERVICE_INSTANCE_ID: (_RES_INSTANCE, pl.String())}
    for i, key in enumerate(a.RESOURCE_MODEL_KEYS):
        keys[key] = (f"{_RES_MODEL}{i}", pl.String())
    for column, key in dimensions.items():
        keys.setdefault(key, (f"__res_dim_{column}", pl.String()))
    return keys


def _gateway_overhead(spans: pl.DataFrame, engine: pl.DataFrame) -> pl.DataFrame:
    """Attach the duration of each engine span's gateway parent (same trace), if any, and add
    the failed gateway spans no engine span answered (:func:`_failed_gateway`)."""
    is_gateway = pl.col(c.NAME) == a.GATEWAY_SPAN
    engine = engine.with_columns(pl.lit(False).alias(_IS_GW))
    if not spans.select(is_gateway.any()).item():
        # a vLLM fleet without a gateway: no join over two id strings
        return engine.with_columns(pl.lit(None, pl.Int64).alias(_GW_DUR))
    gateway_spans = spans.filter(is_gateway)
    gateways = gateway_spans.select(
        pl.col(c.TRACE_ID), pl.col(c.SPAN_ID).alias(_GW_ID),
        (pl.col(c.END_NS) - pl.col(c.START_NS)).alias(_GW_DUR),
    )
    joined = engine.join(
        gateways, left_on=[c.TRACE_ID, c.PARENT_SPAN_ID], right_on=[c.TRACE_ID, _GW_ID],
        how="left", maintain_order="left",
    )
    failed = _failed_gateway(gateway_spans, engine)
    if failed.height == 0:
        return joined
    return pl.concat([joined, failed.select(joined.columns)], how="vertical_relaxed")


def _failed_gateway(gateway_spans: pl.DataFrame, engine: pl.DataFrame) -> pl.DataFrame:
    """Gateway spans that failed (status ERROR) with no request span under them: the requests
    an engine never answered (down, hung, refused). They keep their own duration (what the
    client waited) and no gateway overhead."""
    failed = gateway_spans.filter(pl.col(c.STATUS_CODE) == _STATUS_ERROR)
    if failed.height == 0:
        return failed
    answered = engine.filter(pl.col(c.PARENT_SPAN_ID) != "").select(
        c.TRACE_ID, pl.col(c.PARENT_SPAN_ID).alias(c.SPAN_ID))
    failed = failed.join(answered, on=[c.TRACE_ID, c.SPAN_ID], how="anti",
                         maintain_order="left")
    return failed.with_columns(pl.lit(False).alias(_IS_VLLM), pl.lit(True).alias(_IS_GW),
                               pl.lit(None, pl.Int64).alias(_GW_DUR))


def request_spans(spans: pl.DataFrame) -> pl.DataFrame:
    """The deduplicated spans that are requests, with the span attributes fleetlens reads."""
    spans = dedup_spans(spans)
    # Span attribute maps repeat a lot (the gen_ai.* keys are promoted to columns): parse
    # each distinct map once.
    spans = per_value(spans, c.ATTRIBUTES, lambda f: extract_keys(f, c.ATTRIBUTES, _span_keys()))
    is_vllm = pl.col(c.NAME) == a.VLLM_REQUEST_SPAN
    is_genai = (
        pl.col(c.KIND).is_in([_SERVER, _CLIENT])
        & (pl.col(c.NAME) != a.GATEWAY_SPAN)
        & pl.any_horizontal(pl.col(_ATTR_IN, _ATTR_OUT, _ATTR_OP).is_not_null())
    )
    candidates = spans.filter(is_vllm | is_genai).with_columns(is_vllm.alias(_IS_VLLM))
    # A client span whose child is also a request span is the same request seen twice.
    # (Skipped when no candidate's span id is any candidate's parent id: nothing to remove.)
    # (Root spans, vLLM's usually, have no parent id: only the others are looked up.)
    parent_ids = candidates.filter(pl.col(c.PARENT_SPAN_ID) != "").get_column(
        c.PARENT_SPAN_ID).unique().implode()
    if parent_ids.list.len().item() and candidates.select(
            pl.col(c.SPAN_ID).is_in(parent_ids).any()).item():
        parents = candidates.select(
            c.TRACE_ID, pl.col(c.PARENT_SPAN_ID).alias(c.SPAN_ID)).unique()
        candidates = candidates.join(parents, on=[c.TRACE_ID, c.SPAN_ID], how="anti",
                                     maintain_order="left")
    return _gateway_overhead(spans, candidates)


#: Span attributes holding durations (seconds); negative ones, and longer ones than
#: :data:`MAX_DURATION_S`, are read as missing.
_DURATION_ATTRIBUTES = (c.GEN_AI_TIME_IN_QUEUE_S, c.GEN_AI_PREFILL_S, c.GEN_AI_DECODE_S,
                        c.GEN_AI_INFERENCE_S, c.GEN_AI_TTFT_S, c.GEN_AI_E2E_S)


#: The longest duration a request attribute may hold (a week): a longer one is no measurement,
#: and in nanoseconds it could not even be added to a timestamp (a client sent 1e300 s).
MAX_DURATION_S = 7 * 24 * 3600.0
#: The most tokens a request may count (1,000x the longest context windows): a larger count is
#: no count, and its energy weight (milli-tokens, int64) would overflow.
MAX_TOKENS = 1 << 32
_TOKEN_ATTRIBUTES = (c.GEN_AI_PROMPT_TOKENS, c.GEN_AI_COMPLETION_TOKENS)
_TOKEN_KEYS = (_ATTR_IN, _ATTR_OUT, _ATTR_CACHED, _ATTR_CACHED_OLD)


def _within(col: str, limit: float) -> pl.Expr:
    """``col`` where it lies in ``[0, limit]``, else null (NaN included)."""
    return pl.when(pl.col(col).is_between(0, limit)).then(pl.col(col)).alias(col)


def _seconds_or(col: str, fallback: pl.Expr) -> pl.Expr:
    return pl.coalesce(pl.col(col), fallback)


def _engine_of_failed(spans: pl.DataFrame) -> pl.DataFrame:
    """Add ``instance_id``; a failed gateway span (:func:`_failed_gateway`) gets the host and
    instance it was routed to, and the service of that instance's answered requests (else the
    gateway's own service)."""
    gateway = pl.col(_IS_GW)
    spans = spans.with_columns(
        pl.when(gateway).then(pl.coalesce(_ATTR_SERVER, c.HOST_NAME)).otherwise(c.HOST_NAME)
        .alias(c.HOST_NAME))
    instance = pl.coalesce(
        pl.when(gateway).then(pl.col(_ATTR_GW_INSTANCE)), pl.col(_RES_INSTANCE),
        pl.concat_str(pl.col(c.HOST_NAME), pl.lit("/"), c.SERVICE_NAME))
    spans = spans.with_columns(instance.alias(c.INSTANCE_ID))
    if not spans.select(gateway.any()).item():
        return spans
    services = (spans.filter(~gateway).group_by(c.INSTANCE_ID)
                .agg(pl.col(c.SERVICE_NAME).min().alias("__engine_service")))
    return spans.join(services, on=c.INSTANCE_ID, how="left", maintain_order="left").with_columns(
        pl.when(gateway).then(pl.coalesce("__engine_service", c.SERVICE_NAME))
        .otherwise(c.SERVICE_NAME).alias(c.SERVICE_NAME)).drop("__engine_service")


def instance_model_map(instance_models: pl.DataFrame) -> pl.DataFrame:
    """The model each instance id's engine labels name (the least non-empty one), sorted by
    instance id: all :func:`normalize` reads of the ``instance_gpus`` mapping, so requests
    change with the mapping only where this does (late points move its first and last
    times, not this)."""
    return instance_models.select(
        c.INSTANCE_ID, pl.col(c.MODEL).alias(_MAP_MODEL)
    ).filter(pl.col(_MAP_MODEL) != "").group_by(c.INSTANCE_ID).agg(
        pl.col(_MAP_MODEL).min()).sort(c.INSTANCE_ID)


@stage(t.REQUESTS)
def normalize(
    spans: pl.DataFrame, instance_models: pl.DataFrame, dimensions: dict[str, str]
) -> pl.DataFrame:
    """Turn raw spans into requests.

    Input: ``spans`` (raw, any number of duplicate deliveries, any mix of span kinds) and
    ``instance_models`` (``instance_id``, ``model``: the agent's engine labels, for requests
    whose span and resource name no model). Output: ``requests``, one row per distinct request
    span, sorted by (arrival_ns, trace_id, span_id), plus ``network_s`` and one column per
    configured dimension. Grain: one request. Invariant: rows out = distinct request spans in.

    Args:
        spans: raw span rows.
        instance_models: distinct (instance_id, model) pairs from the engine metrics.
        dimensions: dimension column -> attribute key (span attribute first, then resource).
    """
    spans = request_spans(spans)
    res_keys = _resource_keys(dimensions)
    spans = extract_keys_distinct(spans, c.RESOURCE_ATTRIBUTES, res_keys)
    span_dims = {key: (f"__span_dim_{i}", pl.String()) for i, key in enumerate(dimensions.values())}
    spans = per_value(spans, c.ATTRIBUTES, lambda f: extract_keys(f, c.ATTRIBUTES, span_dims)
                      .with_columns(first_string_of_key(c.ATTRIBUTES, a.GEN_AI_FINISH_REASONS)
                                    .alias(_FINISH)))
    spans = _engine_of_failed(spans)
    models = instance_model_map(instance_models)
    spans = spans.join(models, on=c.INSTANCE_ID, how="left", maintain_order="left")
    res_models = [pl.col(f"{_RES_MODEL}{i}") for i in range(len(a.RESOURCE_MODEL_KEYS))]
    model = pl.coalesce(
        pl.col(c.GEN_AI_REQUEST_MODEL).replace("", None), *res_models,
        pl.col(_ATTR_RESP_MODEL), pl.col(_MAP_MODEL), pl.lit(""),
    )
    duration_s = (pl.col(c.END_NS) - pl.col(c.START_NS)) / _NS
    inference, prefill, decode = c.GEN_AI_INFERENCE_S, c.GEN_AI_PREFILL_S, c.GEN_AI_DECODE_S
    # vLLM subtracts engine timestamps that stay 0.0 when a step never happened (a request
    # aborted before it was scheduled, or before its first token), so such a phase comes out
    # negative by up to the engine's uptime. A negative duration is no duration: null. So is
    # an absurd one, and an absurd token count: one hostile span must not stop the energy
    # stage (its nanosecond and milli-token integers) for the whole hour, run after run.
    spans = spans.with_columns(
        *(_within(col, MAX_DURATION_S) for col in _DURATION_ATTRIBUTES),
        *(_within(col, MAX_TOKENS) for col in (*_TOKEN_ATTRIBUTES, *_TOKEN_KEYS)))
    out = spans.with_columns(
        pl.coalesce(c.GEN_AI_REQUEST_ID, _ATTR_RESP_ID,
                    pl.concat_str(c.TRACE_ID, pl.lit("-"), c.SPAN_ID)).alias(c.REQUEST_ID),
        model.alias(c.MODEL),
        pl.col(c.START_NS).alias(c.ARRIVAL_NS),
        pl.col(c.GEN_AI_TIME_IN_QUEUE_S).alias(c.QUEUE_S),
        # A missing phase is recovered from the other phase and inference = prefill + decode.
        _seconds_or(prefill, pl.col(inference) - pl.col(decode)).alias(c.PREFILL_S),
        _seconds_or(decode, pl.col(inference) - pl.col(prefill)).alias(c.DECODE_S),
        _seconds_or(inference, pl.col(prefill) + pl.col(decode)).alias(c.INFERENCE_S),
        pl.col(c.GEN_AI_TTFT_S).alias(c.TTFT_S),
        _seconds_or(c.GEN_AI_E2E_S, duration_s).alias(c.E2E_S),
        pl.coalesce(c.GEN_AI_PROMPT_TOKENS, _ATTR_IN).alias(c.INPUT_TOKENS),
        pl.coalesce(c.GEN_AI_COMPLETION_TOKENS, _ATTR_OUT).alias(c.OUTPUT_TOKENS),
        # The current semconv key first, then the spelling older instrumentations use.
        pl.coalesce(_ATTR_CACHED, _ATTR_CACHED_OLD).alias(c.CACHED_TOKENS),
        pl.col(_FINISH).alias(c.FINISH_REASON),
        pl.when(pl.col(_IS_VLLM)).then(pl.lit(SOURCE_VLLM))
        .when(pl.col(_IS_GW)).then(pl.lit(SOURCE_GATEWAY)).otherwise(pl.lit(SOURCE_GENAI))
        .alias(c.SOURCE),
        ((pl.col(_GW_DUR) - (pl.col(c.END_NS) - pl.col(c.START_NS))) / _NS).alias(c.NETWORK_S),
    )
    out = out.with_columns(
        # No token, no first token: vLLM then reports a time to first token of 0.0.
        pl.when(pl.col(c.OUTPUT_TOKENS).fill_null(1) > 0).then(pl.col(c.TTFT_S))
        .alias(c.TTFT_S),
        pl.when(pl.col(c.OUTPUT_TOKENS) > 1)
        .then(pl.col(c.DECODE_S) / (pl.col(c.OUTPUT_TOKENS) - 1)).alias(c.TPOT_S),
        (pl.col(c.E2E_S) - pl.col(c.QUEUE_S) - pl.col(c.PREFILL_S) - pl.col(c.DECODE_S))
        .alias(c.OVERHEAD_S),
        (
            (pl.col(c.STATUS_CODE) == _STATUS_ERROR)
            | pl.col(_ATTR_ERR).is_not_null()
            | pl.col(c.FINISH_REASON).is_in(_ERROR_FINISH_REASONS)
        ).fill_null(False).alias(c.IS_ERROR),
        *[
            pl.coalesce(span_dims[key][0], res_keys[key][0]).alias(col)
            for col, key in dimensions.items()
        ],
    )
    columns = [*t.table(t.REQUESTS).columns, c.NETWORK_S, *dimensions]
    return out.select(columns).sort([c.ARRIVAL_NS, c.TRACE_ID, c.SPAN_ID])

