//! The table of distinct sources a guard plan reads, each interned once with an id, parents
//! before children (see `guards`).

use std::collections::HashMap;
use std::rc::Rc;

use super::source::{ItemKey, Source};

/// What identifies a source structurally: its parent's id and one path component.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum SourceKey {
    Local(String),
    /// By the address of the globals dict (kept alive by the source).
    Global(usize, String),
    Cell(usize),
    /// By the address of the object (kept alive by the source).
    Object(usize),
    Attr(u32, String),
    ClassAttr(u32, String),
    Item(u32, ItemKey),
    DictItem(u32, ItemKey),
    AsTensor(u32),
}

/// Every distinct source guards depend on, parents before children, each with an id.
/// Interning is O(1) per `Rc` seen before and O(depth) otherwise; ids stand for sources in
/// the guard plan, and the readable paths are only rendered when someone asks.
#[derive(Debug, Default)]
pub struct SourceTable {
    /// The source of each id and its parent's id.
    nodes: Vec<(Rc<Source>, Option<u32>)>,
    by_key: HashMap<SourceKey, u32>,
    /// By `Rc` address; the `Rc` is kept so the address cannot be reused while we hold it.
    by_address: HashMap<usize, (Rc<Source>, u32)>,
}

impl SourceTable {
    /// Every source with its parent's id, by id.
    pub fn nodes(&self) -> &[(Rc<Source>, Option<u32>)] {
        &self.nodes
    }

    pub fn intern(&mut self, source: &Rc<Source>) -> u32 {
        let address = Rc::as_ptr(source) as usize;
        if let Some((_, id)) = self.by_address.get(&address) {
            return *id;
        }
        let (key, parent) = match source.as_ref() {
            Source::Local(name) => (SourceKey::Local(name.clone()), None),
            Source::Global { globals, name, .. } => (
                SourceKey::Global(globals.as_ptr() as usize, name.clone()),
                None,
            ),
            Source::Cell(cell) => (SourceKey::Cell(cell.as_ptr() as usize), None),
            Source::Object(object, _) => (SourceKey::Object(object.as_ptr() as usize), None),
            Source::Attr(base, attr) => {
                let parent = self.intern(base);
                (SourceKey::Attr(parent, attr.clone()), Some(parent))
            }
            Source::ClassAttr(base, attr) => {
                let parent = self.intern(base);
                (SourceKey::ClassAttr(parent, attr.clone()), Some(parent))
            }
            Source::Item(base, key) => {
                let parent = self.intern(base);
                (SourceKey::Item(parent, key.clone()), Some(parent))
            }
            Source::DictItem(base, key) => {
                let parent = self.intern(base);
                (SourceKey::DictItem(parent, key.clone()), Some(parent))
            }
            Source::AsTensor(base) => {
                let parent = self.intern(base);
                (SourceKey::AsTensor(parent), Some(parent))
            }
        };
        let id = match self.by_key.get(&key) {
            Some(&id) => id,
            None => {
                let id = self.nodes.len() as u32;
                self.nodes.push((source.clone(), parent));
                self.by_key.insert(key, id);
                id
            }
        };
        self.by_address.insert(address, (source.clone(), id));
        id
    }
}
