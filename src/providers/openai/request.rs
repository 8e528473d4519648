//! An [`LlmRequest`] as a chat-completions request body.
//!
//! - The agent's instructions, with the request's `extra_instructions` after a blank line,
//!   are one system message, first.
//! - User and system messages are messages; an assistant message with empty text is not
//!   sent (OpenAI refuses it).
//! - An assistant message and the function calls right after it (one LLM step) are one
//!   assistant message with `content` and `tool_calls`; calls without text before them are
//!   one assistant message with `content: null`. Each call's output follows as a `tool`
//!   message, in call order, wherever the output sits in the chat: a tool message must
//!   answer a call of the assistant message just before it.
//! - A derived call (`{id}/update_n`, `{id}/finished`) is always its own assistant message
//!   with that one call, followed by its tool message: it was never part of a step.
//! - A call with no output in the chat, an output with no call, and agent-handoff items
//!   are left out: the provider would reject the first two, and has no item for the last.
//! - Call ids are written with the request's [`CallIdMap`]; tool schemas are written from
//!   the request's shared list in its order, so requests of one activity repeat them byte
//!   for byte. `tool_choice` and `parallel_tool_calls` are sent only with tools.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use serde::Serialize;
use serde_json::{Map, Value};

use super::Config;
use crate::providers::CallIdMap;
use crate::{ChatItem, ChatRole, FunctionCall, FunctionCallOutput, LlmRequest, ToolChoice};

/// The request body, borrowing the chat context's text.
#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    messages: Vec<Message<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<Vec<ToolJson<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    stream: bool,
    stream_options: StreamOptions,
    #[serde(flatten)]
    extra: &'a Map<String, Value>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum Message<'a> {
    System {
        content: Cow<'a, str>,
    },
    User {
        content: &'a str,
    },
    Assistant {
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCallJson<'a>>,
    },
    Tool {
        tool_call_id: String,
        content: &'a str,
    },
}

#[derive(Serialize)]
struct ToolCallJson<'a> {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    function: FunctionJson<'a>,
}

#[derive(Serialize)]
struct FunctionJson<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Serialize)]
struct ToolJson<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: ToolFunctionJson<'a>,
}

#[derive(Serialize)]
struct ToolFunctionJson<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

/// The JSON body of `request`, and the call-id table it was written with.
pub(super) fn body(
    config: &Config,
    request: &LlmRequest,
) -> Result<(Vec<u8>, CallIdMap), serde_json::Error> {
    let mut ids = CallIdMap::new();
    let messages = messages(request, &mut ids);
    let has_tools = !request.tools.is_empty();
    let body = Body {
        model: &config.model,
        messages,
        tools: has_tools.then(|| {
            request
                .tools
                .iter()
                .map(|t| ToolJson {
                    kind: "function",
                    function: ToolFunctionJson {
                        name: &t.name,
                        description: &t.description,
                        parameters: &t.parameters,
                    },
                })
                .collect()
        }),
        tool_choice: has_tools.then_some(match request.tool_choice {
            ToolChoice::Auto => "auto",
            ToolChoice::None => "none",
        }),
        parallel_tool_calls: config.parallel_tool_calls.filter(|_| has_tools),
        temperature: config.temperature,
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
        extra: &config.extra,
    };
    Ok((serde_json::to_vec(&body)?, ids))
}

fn messages<'a>(request: &'a LlmRequest, ids: &mut CallIdMap) -> Vec<Message<'a>> {
    let items = request.chat.items();
    let mut out = Vec::with_capacity(items.len() + 1);
    let system = match (
        &*request.instructions,
        request.extra_instructions.as_deref(),
    ) {
        ("", None) => None,
        (instructions, None) => Some(Cow::Borrowed(instructions)),
        ("", Some(extra)) => Some(Cow::Borrowed(extra)),
        (instructions, Some(extra)) => Some(Cow::Owned(format!("{instructions}\n\n{extra}"))),
    };
    if let Some(content) = system {
        out.push(Message::System { content });
    }
    // The first output of each call id; a call takes its output from here.
    let mut outputs: HashMap<&str, &FunctionCallOutput> = HashMap::new();
    for item in items {
        if let ChatItem::FunctionCallOutput(o) = item {
            outputs.entry(o.call_id.as_str()).or_insert(o);
        }
    }
    let mut answered: HashSet<&str> = HashSet::new();
    let mut i = 0;
    while i < items.len() {
        let (text, first_call) = match &items[i] {
            ChatItem::Message(m) => match m.role {
                ChatRole::System => {
                    out.push(Message::System {
                        content: Cow::Borrowed(&m.content),
                    });
                    i += 1;
                    continue;
                }
                ChatRole::User => {
                    out.push(Message::User {
                        content: &m.content,
                    });
                    i += 1;
                    continue;
                }
                ChatRole::Assistant => (Some(m.content.as_str()), i + 1),
            },
            ChatItem::FunctionCall(_) => (None, i),
            // Outputs are sent right after their calls; the chat-completions format has no
            // place for a handoff marker or for item kinds it does not know.
            _ => {
                i += 1;
                continue;
            }
        };
        // The step's calls: the consecutive regular calls, or one derived call alone.
        let mut calls: Vec<&FunctionCall> = Vec::new();
        let mut next = first_call;
        while let Some(ChatItem::FunctionCall(call)) = items.get(next) {
            let derived = is_derived(&call.call_id);
            if derived && (text.is_some() || !calls.is_empty()) {
                break;
            }
            calls.push(call);
            next += 1;
            if derived {
                break;
            }
        }
        i = next;
        let calls: Vec<(&FunctionCall, &FunctionCallOutput)> = calls
            .into_iter()
            .filter_map(|c| {
                let output = outputs.get(c.call_id.as_str())?;
                answered.insert(&c.call_id).then_some((c, *output))
            })
            .collect();
        let text = text.filter(|t| !t.is_empty());
        if text.is_none() && calls.is_empty() {
            continue;
        }
        out.push(Message::Assistant {
            content: text,
            tool_calls: calls
                .iter()
                .map(|(c, _)| ToolCallJson {
                    id: ids.wire(&c.call_id).to_owned(),
                    kind: "function",
                    function: FunctionJson {
                        name: &c.name,
                        arguments: &c.arguments,
                    },
                })
                .collect(),
        });
        for (call, output) in calls {
            out.push(Message::Tool {
                tool_call_id: ids.wire(&call.call_id).to_owned(),
                content: &output.output,
            });
        }
    }
    out
}

/// Whether `call_id` is an async tool's later item: `{id}/update_{n}` or `{id}/finished`.
fn is_derived(call_id: &str) -> bool {
    match call_id.rsplit_once('/') {
        Some((_, "finished")) => true,
        Some((_, tail)) => tail
            .strip_prefix("update_")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::openai::OpenAiLlm;
    use crate::{ChatContext, ToolSchema};
    use serde_json::json;
    use std::sync::Arc;

    fn call(id: &str) -> ChatItem {
        ChatItem::FunctionCall(FunctionCall {
            call_id: id.into(),
            name: "book".into(),
            arguments: "{}".into(),
        })
    }

    fn out(id: &str, text: &str) -> ChatItem {
        ChatItem::FunctionCallOutput(FunctionCallOutput {
            call_id: id.into(),
            name: "book".into(),
            output: text.into(),
            is_error: text.starts_with("Error"),
        })
    }

    fn request(items: Vec<ChatItem>, tools: bool) -> LlmRequest {
        let tools: Vec<ToolSchema> = if tools {
            vec![ToolSchema {
                name: "book".into(),
                description: "Books".into(),
                parameters: json!({"type": "object", "properties": {}}),
            }]
        } else {
            Vec::new()
        };
        LlmRequest {
            agent: "a".into(),
            instructions: "Be brief.".into(),
            extra_instructions: None,
            chat: ChatContext::from(items),
            tools: tools.into(),
            tool_choice: ToolChoice::Auto,
            deferred_call_ids: Vec::new(),
        }
    }

    fn json_of(request: &LlmRequest) -> Value {
        let llm = OpenAiLlm::builder()
            .model("m")
            .parallel_tool_calls(true)
            .build()
            .unwrap();
        serde_json::from_slice(&body(&llm.config, request).unwrap().0).unwrap()
    }

    fn roles(body: &Value) -> Vec<String> {
        body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let role = m["role"].as_str().unwrap().to_owned();
                match m["tool_calls"].as_array() {
                    Some(calls) => format!("{role}+{}", calls.len()),
                    None => role,
                }
            })
            .collect()
    }

    #[test]
    fn text_and_calls_of_a_step_are_one_assistant_message_then_the_outputs() {
        let body = json_of(&request(
            vec![
                ChatItem::message(ChatRole::User, "book two"),
                ChatItem::message(ChatRole::Assistant, "Booking."),
                call("c1"),
                call("c2"),
                out("c1", "ok"),
                out("c2", "Error: full"),
                ChatItem::message(ChatRole::Assistant, "One is booked."),
            ],
            true,
        ));
        assert_eq!(
            roles(&body),
            ["system", "user", "assistant+2", "tool", "tool", "assistant"]
        );
        assert_eq!(body["messages"][2]["content"], "Booking.");
        assert_eq!(body["messages"][4]["tool_call_id"], "c2");
        assert_eq!(body["messages"][4]["content"], "Error: full");
        assert_eq!(body["tool_choice"], "auto");
        assert_eq!(body["parallel_tool_calls"], true);
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
    }

    #[test]
    fn each_update_pair_is_its_own_assistant_message_with_mapped_ids() {
        let body = json_of(&request(
            vec![
                ChatItem::message(ChatRole::User, "book"),
                call("c1~2"),
                out("c1~2", "started"),
                ChatItem::message(ChatRole::Assistant, "Started."),
                call("c1~2/update_1"),
                out("c1~2/update_1", "half"),
                ChatItem::AgentHandoff {
                    from: Some("a".into()),
                    to: "b".into(),
                },
                call("c1~2/finished"),
                out("c1~2/finished", "done"),
            ],
            true,
        ));
        assert_eq!(
            roles(&body),
            [
                "system",
                "user",
                "assistant+1",
                "tool",
                "assistant",
                "assistant+1",
                "tool",
                "assistant+1",
                "tool"
            ]
        );
        assert_eq!(body["messages"][2]["content"], Value::Null);
        assert_eq!(
            body["messages"][5]["tool_calls"][0]["id"],
            "c1-t2-supdate_1"
        );
        assert_eq!(body["messages"][6]["tool_call_id"], "c1-t2-supdate_1");
        assert_eq!(
            body["messages"][7]["tool_calls"][0]["id"],
            "c1-t2-sfinished"
        );
    }

    #[test]
    fn no_empty_assistant_message_no_orphans_and_no_tools_fields_without_tools() {
        let body = json_of(&request(
            vec![
                ChatItem::message(ChatRole::User, "hi"),
                ChatItem::message(ChatRole::Assistant, ""),
                out("ghost", "orphan output"),
                call("open"),
                ChatItem::message(ChatRole::User, "again"),
            ],
            false,
        ));
        assert_eq!(roles(&body), ["system", "user", "user"]);
        for field in ["tools", "tool_choice", "parallel_tool_calls"] {
            assert!(body.get(field).is_none(), "{field} sent without tools");
        }
    }

    #[test]
    fn an_output_later_in_the_chat_is_moved_right_after_its_call() {
        let body = json_of(&request(
            vec![
                call("c1"),
                ChatItem::message(ChatRole::User, "meanwhile"),
                out("c1", "late"),
            ],
            true,
        ));
        assert_eq!(roles(&body), ["system", "assistant+1", "tool", "user"]);
    }

    #[test]
    fn extra_instructions_follow_the_instructions_and_tool_choice_none_is_sent() {
        let mut req = request(vec![ChatItem::message(ChatRole::User, "hi")], true);
        req.extra_instructions = Some("Tell the user about c1.".into());
        req.tool_choice = ToolChoice::None;
        let body = json_of(&req);
        assert_eq!(
            body["messages"][0]["content"],
            "Be brief.\n\nTell the user about c1."
        );
        assert_eq!(body["tool_choice"], "none");
    }

    #[test]
    fn tools_are_byte_stable_across_requests() {
        let llm = OpenAiLlm::builder().model("m").build().unwrap();
        let shared: Arc<[ToolSchema]> = request(vec![], true).tools;
        let tools_of = |items| {
            let mut req = request(items, false);
            req.tools = shared.clone();
            let body: Value = serde_json::from_slice(&body(&llm.config, &req).unwrap().0).unwrap();
            serde_json::to_string(&body["tools"]).unwrap()
        };
        assert_eq!(
            tools_of(vec![]),
            tools_of(vec![ChatItem::message(ChatRole::User, "x")])
        );
    }

    #[test]
    fn derived_ids_are_recognised() {
        assert!(is_derived("c/update_1"));
        assert!(is_derived("c~2/update_12"));
        assert!(is_derived("c/finished"));
        assert!(!is_derived("c/update_"));
        assert!(!is_derived("c/update_x"));
        assert!(!is_derived("c~2"));
    }
}
