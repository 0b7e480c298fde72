//! Conversations the UI keeps: their messages (and what it shows beside them), in one redb
//! database in the data folder, so that the history survives a restart. Each conversation is
//! one JSON value under its id; writes are whole transactions, so a killed server leaves either
//! the old conversation or the new one.

use hillside_documents::{StoreError, StoreFailure};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::path::Path;
use utoipa::ToSchema;

const CONVERSATIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("conversations");
/// One row, `next_id`: ids are never reused, so a deleted conversation's id stays dead.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// The longest title kept; longer ones are cut (at a character boundary).
const MAX_TITLE_CHARS: usize = 200;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// What the UI shows beside the message (speed, K/V reuse, a summary's sources), kept as
    /// given: an object, or null (checked where a change comes in, so that what older versions
    /// stored still reads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub meta: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Conversation {
    pub id: u64,
    pub title: String,
    pub created_s: u64,
    pub updated_s: u64,
    /// Library ids of the documents the conversation is about.
    pub documents: Vec<String>,
    pub messages: Vec<Message>,
}

/// A conversation in the list: no messages, only how many.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ConversationSummary {
    pub id: u64,
    pub title: String,
    pub created_s: u64,
    pub updated_s: u64,
    pub messages: usize,
}

/// The fields a change replaces (those absent stay).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConversationChange {
    pub title: Option<String>,
    pub documents: Option<Vec<String>>,
    pub messages: Option<Vec<Message>>,
}

pub struct Conversations {
    db: Database,
}

fn err(e: impl Into<StoreFailure>) -> StoreError {
    StoreError::new("conversation store", e)
}

fn title_of(title: String) -> String {
    let title = title.trim();
    match title.char_indices().nth(MAX_TITLE_CHARS) {
        Some((cut, _)) => title[..cut].to_string(),
        None => title.to_string(),
    }
}

impl Conversations {
    /// Opens the store at `path`, creating it if missing.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        hillside_engine::private_files::ensure(path)
            .map_err(|source| err(StoreFailure::Create { path: path.to_path_buf(), source }))?;
        let db =
            Database::create(path).map_err(|source| err(StoreFailure::Open { path: path.to_path_buf(), source }))?;
        let txn = db.begin_write().map_err(err)?;
        txn.open_table(CONVERSATIONS).map_err(err)?;
        txn.open_table(META).map_err(err)?;
        txn.commit().map_err(err)?;
        Ok(Self { db })
    }

    pub fn create(&self, change: ConversationChange) -> Result<Conversation, StoreError> {
        let now = crate::unix_now_s();
        let txn = self.db.begin_write().map_err(err)?;
        let conversation = {
            let mut meta = txn.open_table(META).map_err(err)?;
            let id = meta.get("next_id").map_err(err)?.map_or(1, |v| v.value());
            meta.insert("next_id", id + 1).map_err(err)?;
            let conversation = Conversation {
                id,
                title: title_of(change.title.unwrap_or_else(|| "New chat".into())),
                created_s: now,
                updated_s: now,
                documents: change.documents.unwrap_or_default(),
                messages: change.messages.unwrap_or_default(),
            };
            txn.open_table(CONVERSATIONS)
                .map_err(err)?
                .insert(id, serde_json::to_vec(&conversation).map_err(err)?.as_slice())
                .map_err(err)?;
            conversation
        };
        txn.commit().map_err(err)?;
        Ok(conversation)
    }

    pub fn get(&self, id: u64) -> Result<Option<Conversation>, StoreError> {
        let txn = self.db.begin_read().map_err(err)?;
        let table = txn.open_table(CONVERSATIONS).map_err(err)?;
        let value = table.get(id).map_err(err)?;
        value.map(|v| serde_json::from_slice(v.value()).map_err(err)).transpose()
    }

    /// Every conversation whose title or messages hold `query` (any case; all of them when
    /// `None`), the most recently changed first.
    pub fn list(&self, query: Option<&str>) -> Result<Vec<ConversationSummary>, StoreError> {
        let query = query.map(str::trim).filter(|q| !q.is_empty()).map(str::to_lowercase);
        let txn = self.db.begin_read().map_err(err)?;
        let table = txn.open_table(CONVERSATIONS).map_err(err)?;
        let mut found = Vec::new();
        for row in table.iter().map_err(err)? {
            let (_, value) = row.map_err(err)?;
            let c: Conversation = serde_json::from_slice(value.value()).map_err(err)?;
            let matches = |text: &str| query.as_ref().is_none_or(|q| text.to_lowercase().contains(q.as_str()));
            if matches(&c.title) || c.messages.iter().any(|m| matches(&m.content)) {
                found.push(ConversationSummary {
                    id: c.id,
                    title: c.title,
                    created_s: c.created_s,
                    updated_s: c.updated_s,
                    messages: c.messages.len(),
                });
            }
        }
        found.sort_by(|a, b| b.updated_s.cmp(&a.updated_s).then(b.id.cmp(&a.id)));
        Ok(found)
    }

    /// Applies `change`; `None` if there is no such conversation.
    pub fn update(&self, id: u64, change: ConversationChange) -> Result<Option<Conversation>, StoreError> {
        let txn = self.db.begin_write().map_err(err)?;
        let updated = {
            let mut table = txn.open_table(CONVERSATIONS).map_err(err)?;
            let Some(mut c) = table
                .get(id)
                .map_err(err)?
                .map(|v| serde_json::from_slice::<Conversation>(v.value()))
                .transpose()
                .map_err(err)?
            else {
                return Ok(None);
            };
            if let Some(title) = change.title {
                c.title = title_of(title);
            }
            if let Some(documents) = change.documents {
                c.documents = documents;
            }
            if let Some(messages) = change.messages {
                c.messages = messages;
            }
            c.updated_s = crate::unix_now_s();
            table.insert(id, serde_json::to_vec(&c).map_err(err)?.as_slice()).map_err(err)?;
            c
        };
        txn.commit().map_err(err)?;
        Ok(Some(updated))
    }

    /// Whether there was such a conversation.
    pub fn delete(&self, id: u64) -> Result<bool, StoreError> {
        let txn = self.db.begin_write().map_err(err)?;
        let removed = txn.open_table(CONVERSATIONS).map_err(err)?.remove(id).map_err(err)?.is_some();
        txn.commit().map_err(err)?;
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(role: Role, content: &str) -> Message {
        Message { role, content: content.into(), meta: None }
    }

    #[test]
    fn conversations_survive_a_reopen_and_are_found_by_their_words() {
        let scratch = tempfile::Builder::new().prefix("hillside-conversations-").tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        let path = dir.join("conversations.redb");
        let (first, second) = {
            let store = Conversations::open(&path).unwrap();
            let first =
                store.create(ConversationChange { title: Some("  Licences ".into()), ..Default::default() }).unwrap();
            let second = store
                .create(ConversationChange {
                    messages: Some(vec![message(Role::User, "Tell me about Darcy")]),
                    ..Default::default()
                })
                .unwrap();
            assert_eq!(first.title, "Licences");
            assert_eq!(second.title, "New chat");
            (first.id, second.id)
        };
        let store = Conversations::open(&path).unwrap();
        let renamed = store
            .update(first, ConversationChange { title: Some("x".repeat(500)), ..Default::default() })
            .unwrap()
            .unwrap();
        assert_eq!(renamed.title.chars().count(), MAX_TITLE_CHARS);
        assert_eq!(store.list(Some("darcy")).unwrap().iter().map(|c| c.id).collect::<Vec<_>>(), vec![second]);
        assert_eq!(store.list(None).unwrap().len(), 2);
        assert!(store.delete(second).unwrap());
        assert!(!store.delete(second).unwrap());
        assert!(store.get(second).unwrap().is_none());
        assert!(store.update(second, ConversationChange::default()).unwrap().is_none());
        // A new conversation never takes a deleted one's id.
        assert!(store.create(ConversationChange::default()).unwrap().id > second);
    }
}
