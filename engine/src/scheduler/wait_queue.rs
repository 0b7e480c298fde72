//! The requests waiting for a live slot: single requests, and groups (a summary's chunks and
//! merges) that count as one request for admission and take their turns one member at a time.
//! A group goes to the back of the line after each member it starts, so a chat request that
//! arrives behind a summary of hundreds of chunks waits for one of them, not all of them.

use super::Job;
use std::collections::{HashMap, VecDeque};

/// Whose turn comes next.
enum Turn {
    Single(Job),
    /// A group with at least one waiting member.
    Group(u64),
}

#[derive(Default)]
pub(super) struct WaitQueue {
    turns: VecDeque<Turn>,
    /// Every open group's waiting members, in the order they were submitted.
    groups: HashMap<u64, VecDeque<Job>>,
}

impl WaitQueue {
    /// What counts against `max_queued`: single requests waiting, and every open group.
    pub fn counted(&self) -> usize {
        self.turns.iter().filter(|t| matches!(t, Turn::Single(_))).count() + self.groups.len()
    }

    /// Whether no request waits for a slot (an open group with no waiting member does not).
    pub fn is_empty(&self) -> bool {
        self.turns.is_empty()
    }

    /// Turns waiting: each single request, and each group with members waiting, counts once.
    pub fn len(&self) -> usize {
        self.turns.len()
    }

    pub fn push(&mut self, job: Job) {
        self.turns.push_back(Turn::Single(job));
    }

    pub fn open_group(&mut self, group: u64) {
        self.groups.insert(group, VecDeque::new());
    }

    /// Queues a member of an open group (a group is open while its handle lives).
    pub fn push_member(&mut self, group: u64, job: Job) {
        let members = self.groups.get_mut(&group).expect("an open group");
        if members.is_empty() {
            self.turns.push_back(Turn::Group(group));
        }
        members.push_back(job);
    }

    /// Closes a group: its members still waiting, for the caller to end.
    pub fn close_group(&mut self, group: u64) -> Vec<Job> {
        self.turns.retain(|t| !matches!(t, Turn::Group(g) if *g == group));
        self.groups.remove(&group).map(Vec::from).unwrap_or_default()
    }

    /// The request whose turn it is: a single one, or a group's first waiting member (the
    /// group then waits behind everyone else for its next).
    pub fn next(&mut self) -> Option<Job> {
        match self.turns.pop_front()? {
            Turn::Single(job) => Some(job),
            Turn::Group(group) => {
                let members = self.groups.get_mut(&group).expect("a queued group is open");
                let job = members.pop_front().expect("a queued group has a waiting member");
                if !members.is_empty() {
                    self.turns.push_back(Turn::Group(group));
                }
                Some(job)
            }
        }
    }

    /// Every waiting request, groups' members included; the groups stay open, empty.
    pub fn drain(&mut self) -> Vec<Job> {
        let mut jobs = Vec::new();
        for turn in self.turns.drain(..) {
            match turn {
                Turn::Single(job) => jobs.push(job),
                Turn::Group(group) => {
                    jobs.extend(self.groups.get_mut(&group).map(|m| m.drain(..)).into_iter().flatten())
                }
            }
        }
        jobs
    }

    /// The request each waiting turn starts next.
    pub fn heads(&self) -> impl Iterator<Item = &Job> {
        self.turns.iter().filter_map(|t| match t {
            Turn::Single(job) => Some(job),
            Turn::Group(group) => self.groups.get(group).and_then(VecDeque::front),
        })
    }
}
