//! What the app holds while it runs: its server and the files the user chose.

use super::server::Running;
use hillside_server::ChosenPaths;
use std::sync::{Arc, Mutex};

pub struct AppState {
    server: Mutex<Running>,
    pub chosen: Arc<ChosenPaths>,
}

impl AppState {
    pub fn new(server: Running, chosen: Arc<ChosenPaths>) -> Self {
        Self { server: Mutex::new(server), chosen }
    }

    pub fn server_info(&self) -> super::server::ServerInfo {
        self.server.lock().unwrap_or_else(|p| p.into_inner()).info()
    }

    pub fn stop_server(&self) {
        self.server.lock().unwrap_or_else(|p| p.into_inner()).stop();
    }
}
