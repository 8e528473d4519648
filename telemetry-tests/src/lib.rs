//! An in-memory OpenTelemetry pipeline for the telemetry tests: the engine's `tracing`
//! spans through `tracing-opentelemetry` into the SDK's in-memory span exporter, and its
//! metrics through a meter provider into the in-memory metric exporter. What a host does
//! with a real exporter, kept where a test can read it.
//!
//! The subscriber is the calling thread's default while the [`Pipeline`] lives: a test
//! under `#[switchboard::test]` runs its sessions on that thread (`Engine::current`), so
//! every span of the conversation reaches it, and tests running in parallel on other
//! threads do not mix their spans in.

use std::collections::HashMap;
use std::fmt::Write as _;

use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use switchboard::telemetry::opentelemetry::trace::{SpanId, TracerProvider as _};
use switchboard::telemetry::opentelemetry::{KeyValue, Value};
use switchboard::telemetry::Telemetry;
use tracing_subscriber::layer::SubscriberExt;

/// A tracer and a meter provider writing to memory, the tracer installed as this thread's
/// `tracing` subscriber until the pipeline is dropped.
pub struct Pipeline {
    spans: InMemorySpanExporter,
    metrics: InMemoryMetricExporter,
    tracer_provider: SdkTracerProvider,
    meter_provider: SdkMeterProvider,
    _default: tracing::subscriber::DefaultGuard,
}

/// A span as a test reads it: its name, its parent's name and the engine's attributes.
#[derive(Clone, Debug)]
pub struct Span {
    /// The span's name (`session`, `turn`, …).
    pub name: String,
    /// Its attributes, as text.
    pub attributes: HashMap<String, String>,
    /// Its id.
    pub id: SpanId,
    /// Its parent's id (`SpanId::INVALID` for a root).
    pub parent: SpanId,
    /// The ids of the spans it links to (`follows_from`).
    pub links: Vec<SpanId>,
}

impl Span {
    /// The attribute `key`, as text.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// One data point of a metric: its attributes and its value (a sum's value, a
/// histogram's count and sum).
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// The point's attributes, as text, sorted by key.
    pub attributes: Vec<(String, String)>,
    /// A sum's value or a histogram's count.
    pub count: f64,
    /// A histogram's sum (a sum's value again for a sum).
    pub sum: f64,
}

impl Point {
    /// The attribute `key`, as text.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

impl Pipeline {
    /// Installs the pipeline as this thread's subscriber.
    pub fn install() -> Self {
        let spans = InMemorySpanExporter::default();
        let tracer_provider = SdkTracerProvider::builder()
            .with_simple_exporter(spans.clone())
            .build();
        let metrics = InMemoryMetricExporter::default();
        let meter_provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(metrics.clone()).build())
            .build();
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer_provider.tracer("telemetry-tests"))
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_level(false)
            .with_target(false);
        let subscriber = tracing_subscriber::registry().with(layer);
        let default = tracing::subscriber::set_default(subscriber);
        Self {
            spans,
            metrics,
            tracer_provider,
            meter_provider,
            _default: default,
        }
    }

    /// The engine's instruments on this pipeline's meter provider.
    pub fn telemetry(&self) -> Telemetry {
        Telemetry::from_provider(&self.meter_provider)
    }

    /// Every span ended so far.
    pub fn spans(&self) -> Vec<Span> {
        let _ = self.tracer_provider.force_flush();
        self.spans
            .get_finished_spans()
            .unwrap_or_default()
            .into_iter()
            .map(span)
            .collect()
    }

    /// The spans ended so far as an indented tree, children in start order: each line
    /// the span's name and the attributes in `shown`.
    pub fn tree(&self, shown: &[&str]) -> String {
        let _ = self.tracer_provider.force_flush();
        let mut spans = self.spans.get_finished_spans().unwrap_or_default();
        spans.sort_by_key(|s| s.start_time);
        render_tree(&spans, shown)
    }

    /// Every data point of metric `name`, after collecting now.
    pub fn metric(&self, name: &str) -> Vec<Point> {
        let _ = self.meter_provider.force_flush();
        let exported = self.metrics.get_finished_metrics().unwrap_or_default();
        // Cumulative temporality: the last collection holds everything so far.
        exported
            .last()
            .map(|resource| points(resource, name))
            .unwrap_or_default()
    }
}

/// A tree of `spans` (ordered by start), one line per span.
pub fn render_tree(spans: &[SpanData], shown: &[&str]) -> String {
    let ids: Vec<SpanId> = spans.iter().map(|s| s.span_context.span_id()).collect();
    let mut out = String::new();
    let roots = spans
        .iter()
        .filter(|s| !ids.contains(&s.parent_span_id))
        .collect::<Vec<_>>();
    for root in roots {
        write_span(&mut out, spans, root, shown, 0);
    }
    out
}

fn write_span(out: &mut String, all: &[SpanData], span: &SpanData, shown: &[&str], depth: usize) {
    let attributes: Vec<String> = shown
        .iter()
        .filter_map(|key| {
            span.attributes
                .iter()
                .find(|kv| kv.key.as_str() == *key)
                .map(|kv| format!("{key}={}", text(&kv.value)))
        })
        .collect();
    let _ = writeln!(
        out,
        "{:indent$}{}{}",
        "",
        span.name,
        if attributes.is_empty() {
            String::new()
        } else {
            format!(" {{{}}}", attributes.join(" "))
        },
        indent = depth * 2
    );
    let id = span.span_context.span_id();
    for child in all.iter().filter(|s| s.parent_span_id == id) {
        write_span(out, all, child, shown, depth + 1);
    }
}

fn span(data: SpanData) -> Span {
    Span {
        name: data.name.to_string(),
        attributes: data
            .attributes
            .iter()
            .map(|kv| (kv.key.to_string(), text(&kv.value)))
            .collect(),
        id: data.span_context.span_id(),
        parent: data.parent_span_id,
        links: data
            .links
            .iter()
            .map(|link| link.span_context.span_id())
            .collect(),
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.as_str().to_owned(),
        other => other.to_string(),
    }
}

fn attributes<'a>(kvs: impl Iterator<Item = &'a KeyValue>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = kvs
        .map(|kv| (kv.key.to_string(), text(&kv.value)))
        .collect();
    out.sort();
    out
}

fn points(resource: &ResourceMetrics, name: &str) -> Vec<Point> {
    let mut out = Vec::new();
    for scope in resource.scope_metrics() {
        for metric in scope.metrics().filter(|m| m.name() == name) {
            match metric.data() {
                AggregatedMetrics::F64(MetricData::Histogram(h)) => {
                    out.extend(h.data_points().map(|p| Point {
                        attributes: attributes(p.attributes()),
                        count: p.count() as f64,
                        sum: p.sum(),
                    }));
                }
                AggregatedMetrics::U64(MetricData::Sum(s)) => {
                    out.extend(s.data_points().map(|p| Point {
                        attributes: attributes(p.attributes()),
                        count: p.value() as f64,
                        sum: p.value() as f64,
                    }));
                }
                AggregatedMetrics::I64(MetricData::Sum(s)) => {
                    out.extend(s.data_points().map(|p| Point {
                        attributes: attributes(p.attributes()),
                        count: p.value() as f64,
                        sum: p.value() as f64,
                    }));
                }
                _ => {}
            }
        }
    }
    out
}

/// A model that answers each request from a script, after a pause: in paused tokio time
/// nothing else moves the clock, so a test knows each request's time to first token, and
/// a turn's latency, to tokio's timer tick (1 ms).
pub struct PacedLlm {
    script: std::sync::Mutex<std::collections::VecDeque<(std::time::Duration, Vec<LlmChunk>)>>,
}

use switchboard::{Llm, LlmChunk, LlmRequest, LlmStream};

impl PacedLlm {
    /// Answers the requests in order: each waits its pause, then gives its chunks at once.
    /// A request past the script's end waits an hour (the test ends or interrupts it first).
    pub fn new(
        script: impl IntoIterator<Item = (std::time::Duration, Vec<LlmChunk>)>,
    ) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            script: std::sync::Mutex::new(script.into_iter().collect()),
        })
    }
}

impl Llm for PacedLlm {
    fn chat(&self, _request: LlmRequest) -> LlmStream {
        use futures_util::StreamExt as _;
        let (pause, chunks) = self
            .script
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
            .unwrap_or((std::time::Duration::from_secs(3600), Vec::new()));
        futures_util::stream::once(tokio::time::sleep(pause))
            .flat_map(move |()| futures_util::stream::iter(chunks.clone().into_iter().map(Ok)))
            .boxed()
    }

    fn name(&self) -> &str {
        "paced"
    }
}
