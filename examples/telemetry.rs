//! OpenTelemetry: the span tree and the metric values of a scripted conversation.
//!
//! ```text
//! cargo run --example telemetry --features telemetry
//! ```
//!
//! A host span (`call`) around a session; one turn in which the model calls a tool that
//! looks something up for 50 ms, then one in which a tool hands the call to another agent.
//! The engine's `tracing` spans go through `tracing-opentelemetry` into the SDK's
//! in-memory span exporter, its metrics through a meter provider into the in-memory metric
//! exporter; at the end both are printed. A real host swaps the in-memory exporters for
//! its own (OTLP, say) and keeps the rest: see docs/production.md, "Telemetry".

use std::time::Duration;

use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::telemetry::opentelemetry::trace::TracerProvider as _;
use switchboard::telemetry::Telemetry;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{LlmUsage, NoArgs};
use tracing::Instrument as _;
use tracing_subscriber::layer::SubscriberExt as _;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. The pipeline: spans and metrics into memory (a host: its exporters).
    let spans = InMemorySpanExporter::default();
    let tracer_provider = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let metrics = InMemoryMetricExporter::default();
    let meter_provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(metrics.clone()).build())
        .build();
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer_provider.tracer("example"))
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false);
    // Global: the engine's sessions run on its own threads.
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(otel))?;

    // 2. The engine records its metrics on instruments from the meter provider.
    let engine = Engine::start()?;
    engine.set_telemetry(Some(Telemetry::from_provider(&meter_provider)));

    // 3. A conversation: a lookup that takes 50 ms, then a handoff to billing.
    let lookup = Tool::new(
        "lookup",
        "Looks up the balance",
        |_ctx: RunContext, _: NoArgs| async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok::<_, ToolFailure>("42 EUR")
        },
    );
    let billing = Agent::builder("billing").instructions("Billing.").build()?;
    let to_billing = billing.clone();
    let transfer = Tool::new(
        "transfer",
        "Transfers to billing",
        move |_ctx: RunContext, _: NoArgs| {
            let billing = to_billing.clone();
            async move { Ok::<_, ToolFailure>(Handoff::to(billing)) }
        },
    );
    let usage = |prompt, completion| LlmUsage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        cached_prompt_tokens: None,
        ..Default::default()
    };
    let llm = ScriptedLlm::new([
        Reply::tool_call("lookup", json!({})).and_usage(usage(120, 9)),
        Reply::text("Your balance is 42 euros.").and_usage(usage(150, 8)),
        Reply::text("Let me transfer you.")
            .and_tool_call("transfer", json!({}))
            .and_usage(usage(170, 12)),
    ]);
    llm.otherwise(Reply::text("Billing here."));
    let reception = Agent::builder("reception")
        .instructions("Receptionist.")
        .tool(lookup)
        .tool(transfer)
        .build()?;

    let call = tracing::info_span!("call", sid = "CA42");
    async {
        let session = Session::builder()
            .id("CA42")
            .llm(llm)
            .agent(reception)
            .start(&engine)
            .await?;
        session.run("What is my balance?").await?;
        session.run("I want to dispute a charge.").await?;
        session.close().await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    }
    .instrument(call)
    .await?;

    // 4. What the exporters got.
    tracer_provider.force_flush()?;
    let mut finished = spans.get_finished_spans()?;
    finished.sort_by_key(|s| s.start_time);
    println!("spans:");
    for root in finished.iter().filter(|s| {
        !finished
            .iter()
            .any(|p| p.span_context.span_id() == s.parent_span_id)
    }) {
        print_span(&finished, root, 1);
    }
    meter_provider.force_flush()?;
    println!("metrics:");
    if let Some(last) = metrics.get_finished_metrics()?.last() {
        for scope in last.scope_metrics() {
            for metric in scope.metrics() {
                print_metric(metric.name(), metric.unit(), metric.data());
            }
        }
    }
    engine.shutdown();

    // What the example shows, checked (CI runs it: `.ci/examples`): the engine's spans
    // under the host's `call`, and each metric recorded.
    let named = |name: &str| finished.iter().any(|span| span.name == name);
    for span in [
        "call",
        "session",
        "turn",
        "llm_request",
        "tool_run",
        "handoff",
    ] {
        if !named(span) {
            return Err(format!("no `{span}` span was exported").into());
        }
    }
    let recorded: Vec<String> = metrics
        .get_finished_metrics()?
        .last()
        .map(|last| {
            last.scope_metrics()
                .flat_map(|scope| scope.metrics().map(|m| m.name().to_owned()))
                .collect()
        })
        .unwrap_or_default();
    for metric in ["turn.e2e_latency", "llm.ttft", "tool.duration"] {
        if !recorded.iter().any(|name| name.contains(metric)) {
            return Err(format!("no `{metric}` metric was exported: {recorded:?}").into());
        }
    }
    Ok(())
}

/// One span per line, its children indented under it, with the engine's attributes.
fn print_span(all: &[SpanData], span: &SpanData, depth: usize) {
    let shown = [
        "sid", "session", "agent", "kind", "llm", "tool", "from", "to",
    ];
    let attributes: Vec<String> = span
        .attributes
        .iter()
        .filter(|kv| shown.contains(&kv.key.as_str()))
        .map(|kv| format!("{}={}", kv.key, kv.value))
        .collect();
    let took = span
        .end_time
        .duration_since(span.start_time)
        .unwrap_or_default();
    println!(
        "{:indent$}{} {{{}}} {took:.1?}",
        "",
        span.name,
        attributes.join(" "),
        indent = depth * 2
    );
    let id = span.span_context.span_id();
    for child in all.iter().filter(|s| s.parent_span_id == id) {
        print_span(all, child, depth + 1);
    }
}

/// Each data point of a metric: a histogram's count, sum and mean, a sum's value.
fn print_metric(name: &str, unit: &str, data: &AggregatedMetrics) {
    let attributes = |kvs: Vec<String>| kvs.join(" ");
    match data {
        AggregatedMetrics::F64(MetricData::Histogram(h)) => {
            for p in h.data_points() {
                let kvs = p
                    .attributes()
                    .map(|kv| format!("{}={}", kv.key, kv.value))
                    .collect();
                println!(
                    "  {name} {{{}}} count={} sum={:.3}{unit} mean={:.3}{unit}",
                    attributes(kvs),
                    p.count(),
                    p.sum(),
                    p.sum() / p.count().max(1) as f64,
                );
            }
        }
        AggregatedMetrics::U64(MetricData::Sum(s)) => {
            for p in s.data_points() {
                let kvs = p
                    .attributes()
                    .map(|kv| format!("{}={}", kv.key, kv.value))
                    .collect();
                println!("  {name} {{{}}} {} {unit}", attributes(kvs), p.value());
            }
        }
        AggregatedMetrics::I64(MetricData::Sum(s)) => {
            for p in s.data_points() {
                let kvs = p
                    .attributes()
                    .map(|kv| format!("{}={}", kv.key, kv.value))
                    .collect();
                println!("  {name} {{{}}} {} {unit}", attributes(kvs), p.value());
            }
        }
        _ => {}
    }
}
