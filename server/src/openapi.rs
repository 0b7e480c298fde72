//! `GET /openapi.json`, generated from the route annotations and the wire types, with what only
//! the loaded model knows (its vocabulary) filled in when served.

use crate::routes::{chat, completions, conversations, documents, info, models, settings};
use crate::{run, App};
use axum::extract::State;
use axum::Json;
use serde_json::Value;
use std::sync::Arc;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(title = "Hillside", description = "A local, OpenAI-compatible endpoint for long documents"),
    paths(
        chat::chat_completions,
        completions::completions,
        info::models,
        info::model,
        info::health,
        info::sequences,
        info::tiers,
        info::config,
        settings::get,
        settings::put,
        conversations::list,
        conversations::create,
        conversations::get,
        conversations::change,
        conversations::delete,
        documents::add,
        documents::list,
        documents::get,
        documents::delete,
        documents::summary,
        documents::text,
        models::list,
        models::pull,
        models::downloads,
        models::cancel,
        models::remove,
        models::load,
        models::import,
    ),
    components(schemas(crate::types::ChatCompletionChunk, crate::types::ChatExtension))
)]
struct ApiDoc;

pub async fn document(State(app): State<Arc<App>>) -> Json<Value> {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the document is JSON");
    add_body_refusals(&mut doc);
    describe_event_streams(&mut doc);
    link_created_resources(&mut doc);
    bound_untagged_forms(&mut doc);
    let serving = app.serving();
    if let Ok((engine, _)) = serving.local() {
        bound_token_ids(&mut doc, engine.model().config.vocab_size);
    }
    bound_reply_lengths(&mut doc, serving.context_tokens());
    Json(doc)
}

/// Every route that takes a body refuses one over the size limit (413) or not sent as JSON (415,
/// which keeps web pages from posting to it); said once here rather than on each route.
fn add_body_refusals(doc: &mut Value) {
    let error = |why: &str| {
        serde_json::json!({"description": why,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}})
    };
    let paths = doc.get_mut("paths").and_then(Value::as_object_mut);
    for operation in
        paths.into_iter().flat_map(|p| p.values_mut()).filter_map(Value::as_object_mut).flat_map(|m| m.values_mut())
    {
        if operation.get("requestBody").is_none() {
            continue;
        }
        let responses = &mut operation["responses"];
        for (status, why) in [("413", "The body is over the size limit"), ("415", "The body is not sent as JSON")] {
            if responses.get(status).is_none() {
                responses[status] = error(why);
            }
        }
    }
}

/// Before Open API 3.2, a `text/event-stream` response's schema describes one event (`data`,
/// `event`, `id`): each route's event type is the JSON in `data`, which may also be an error
/// body, and the stream ends with `[DONE]`.
fn describe_event_streams(doc: &mut Value) {
    let paths = doc.get_mut("paths").and_then(Value::as_object_mut);
    let operations = paths.into_iter().flat_map(|p| p.values_mut()).filter_map(Value::as_object_mut);
    let responses = operations.flat_map(|m| m.values_mut()).filter_map(|o| o.get_mut("responses"));
    for response in responses.filter_map(Value::as_object_mut).flat_map(|r| r.values_mut()) {
        let Some(stream) = response.pointer_mut("/content/text~1event-stream") else { continue };
        let payload = stream["schema"].take();
        stream["schema"] = serde_json::json!({
            "type": "object",
            "required": ["data"],
            "properties": {
                "data": {"anyOf": [
                    {"const": "[DONE]"},
                    {"type": "string", "contentMediaType": "application/json",
                     "contentSchema": {"oneOf": [payload, {"$ref": "#/components/schemas/ErrorBody"}]}},
                ]},
            },
        });
    }
}

/// What a `POST` to a collection creates (201, with its `id`) is what the routes under
/// `{collection}/{id}` (and below it) take: said as Open API links, which clients and tools
/// follow.
fn link_created_resources(doc: &mut Value) {
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else { return };
    let items: Vec<(String, String, String)> = paths
        .iter()
        .filter_map(|(path, item)| Some((&path[..path.find("/{id}")?], path, item.as_object()?)))
        .flat_map(|(collection, path, item)| {
            item.keys().map(move |method| (collection.to_string(), path.clone(), method.clone()))
        })
        .collect();
    for (collection, path, method) in items {
        let Some(created) = paths.get_mut(&collection).and_then(|c| c.pointer_mut("/post/responses/201")) else {
            continue;
        };
        let pointer = path.replace('~', "~0").replace('/', "~1");
        let name = format!("{method}{}", path[collection.len()..].replace("/{id}", "").replace('/', "_"));
        created["links"][name] = serde_json::json!({
            "operationRef": format!("#/paths/{pointer}/{method}"),
            "parameters": {"id": "$response.body#/id"},
        });
    }
}

/// A reply is at most the context long (less the prompt's tokens, which no schema can say).
fn bound_reply_lengths(doc: &mut Value, context_tokens: usize) {
    for field in [
        "/components/schemas/SamplingFields/properties/max_tokens",
        "/components/schemas/ChatCompletionRequest/properties/max_completion_tokens",
    ] {
        if let Some(schema) = doc.pointer_mut(field) {
            schema["maximum"] = context_tokens.into();
        }
    }
}

/// A prompt given as token ids takes ids below the model's vocabulary size.
fn bound_token_ids(doc: &mut Value, vocab_size: usize) {
    for form in forms(doc, "Prompt") {
        if form["items"]["type"] == "integer" {
            form["items"]["maximum"] = Value::from(vocab_size.saturating_sub(1));
        }
    }
}

/// The bounds of the untagged forms (which take no schema attributes), as `run` checks them: a
/// prompt is one non-empty prompt (a text, a list of one text, or token ids); stop strings are
/// non-empty and bounded in number and length.
fn bound_untagged_forms(doc: &mut Value) {
    for form in forms(doc, "Prompt") {
        match form["type"].as_str() {
            Some("string") => form["minLength"] = 1.into(),
            Some("array") => {
                form["minItems"] = 1.into();
                if form["items"]["type"] == "string" {
                    form["items"]["minLength"] = 1.into();
                    form["maxItems"] = 1.into();
                }
            }
            _ => {}
        }
    }
    let text = serde_json::json!({"type": "string", "minLength": 1, "maxLength": run::MAX_STOP_CHARS});
    for form in forms(doc, "Stop") {
        match form["type"].as_str() {
            Some("string") => *form = text.clone(),
            Some("array") => {
                form["items"] = text.clone();
                form["maxItems"] = run::MAX_STOP_STRINGS.into();
            }
            _ => {}
        }
    }
}

fn forms<'d>(doc: &'d mut Value, schema: &str) -> impl Iterator<Item = &'d mut Value> {
    let pointer = format!("/components/schemas/{schema}/oneOf");
    doc.pointer_mut(&pointer).and_then(Value::as_array_mut).into_iter().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_with_a_body_documents_its_refusals() {
        let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        add_body_refusals(&mut doc);
        let put = &doc["paths"]["/v1/hillside/settings"]["put"]["responses"];
        assert!(put.get("415").is_some() && put.get("413").is_some(), "{put}");
        assert!(doc["paths"]["/health"]["get"]["responses"].get("415").is_none(), "no body, no 415");
    }

    #[test]
    fn an_event_streams_schema_describes_its_events() {
        let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        describe_event_streams(&mut doc);
        let stream = &doc["paths"]["/v1/hillside/documents/{id}/summary"]["post"]["responses"]["200"]["content"]
            ["text/event-stream"]["schema"];
        let forms = &stream["properties"]["data"]["anyOf"];
        assert_eq!(forms[0]["const"], "[DONE]", "{stream}");
        assert_eq!(forms[1]["contentSchema"]["oneOf"][0]["$ref"], "#/components/schemas/SummaryEvent", "{stream}");
    }

    #[test]
    fn a_created_conversation_links_to_the_routes_that_take_its_id() {
        let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        link_created_resources(&mut doc);
        let links = &doc["paths"]["/v1/hillside/conversations"]["post"]["responses"]["201"]["links"];
        assert_eq!(links["delete"]["operationRef"], "#/paths/~1v1~1hillside~1conversations~1{id}/delete");
        assert_eq!(links.as_object().map(|l| l.len()), Some(3), "get, patch and delete: {links}");
        let links = &doc["paths"]["/v1/hillside/documents"]["post"]["responses"]["201"]["links"];
        assert_eq!(links["post_summary"]["operationRef"], "#/paths/~1v1~1hillside~1documents~1{id}~1summary/post");
    }

    #[test]
    fn token_id_prompts_are_bounded_by_the_vocabulary() {
        let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        bound_token_ids(&mut doc, 49_152);
        let forms = doc.pointer("/components/schemas/Prompt/oneOf").unwrap().as_array().unwrap();
        let bounded: Vec<&Value> = forms.iter().filter_map(|f| f["items"].get("maximum")).collect();
        assert_eq!(bounded, [&Value::from(49_151)], "{forms:?}");
        bound_untagged_forms(&mut doc);
        let forms = doc.pointer("/components/schemas/Prompt/oneOf").unwrap().as_array().unwrap();
        assert!(forms.iter().all(|f| f.get("minLength").or(f.get("minItems")) == Some(&Value::from(1))), "{forms:?}");
    }
}
