//! How the warm pools are sized and refilled ([`PoolConfig`], with the defaults a node starts
//! with), and what [`crate::Node::pool_stats`] reports of each pool ([`PoolStats`]).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::ids::{TemplateName, TemplateRef};

/// How the warm pools are sized and refilled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// The floor of each template's pool by template name (the pool follows the newest build
    /// of the name): members kept even when nobody creates. Zero: a pool only while creates use
    /// the template.
    pub sizes: BTreeMap<TemplateName, usize>,
    /// The floor of templates not listed in [`PoolConfig::sizes`].
    pub default_size: usize,
    /// The most members demand grows a pool to (a floor above it wins). Zero: pools keep
    /// exactly their floors.
    pub ceiling: usize,
    /// How far back the creates that size a pool are counted.
    pub window: Duration,
    /// Members made at the same time, across all pools of the node (at least one).
    pub refills: usize,
    /// How often the reconciler runs on its own (it also runs right after every take and every
    /// template build). `None`: never on its own; call [`crate::Node::reconcile_pools`].
    pub tick: Option<Duration>,
}

/// The floor of each stock template (`minimal`, `base`) by default: two concurrent creates are
/// served warm, and a refill (a restore, ~100-300 ms under TCG) is under way after each.
pub const DEFAULT_POOL_SIZE: usize = 2;

/// The stock templates, which get [`DEFAULT_POOL_SIZE`] members by default.
pub const STOCK_TEMPLATES: &[&str] = &["minimal", "base"];

/// How large a pool grows on demand by default.
pub const DEFAULT_POOL_CEILING: usize = 16;

/// How far back creates count by default.
pub const DEFAULT_POOL_WINDOW: Duration = Duration::from_secs(60);

/// Members made at once by default: two VMs restoring keep two host CPUs busy, and a third
/// would only queue behind them.
pub const DEFAULT_POOL_REFILLS: usize = 2;

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            sizes: STOCK_TEMPLATES
                .iter()
                .map(|n| {
                    (
                        n.parse().expect("stock template names are valid"),
                        DEFAULT_POOL_SIZE,
                    )
                })
                .collect(),
            default_size: 0,
            ceiling: DEFAULT_POOL_CEILING,
            window: DEFAULT_POOL_WINDOW,
            refills: DEFAULT_POOL_REFILLS,
            tick: Some(Duration::from_secs(5)),
        }
    }
}

impl PoolConfig {
    /// No pools at all.
    pub fn disabled() -> Self {
        PoolConfig {
            sizes: BTreeMap::new(),
            default_size: 0,
            ceiling: 0,
            window: DEFAULT_POOL_WINDOW,
            refills: DEFAULT_POOL_REFILLS,
            tick: None,
        }
    }

    /// Pools of exactly the given sizes, whatever the demand, refilled one member at a time.
    pub fn fixed(sizes: BTreeMap<TemplateName, usize>, tick: Option<Duration>) -> Self {
        PoolConfig {
            sizes,
            ceiling: 0,
            refills: 1,
            tick,
            ..PoolConfig::disabled()
        }
    }

    /// The floor of `name`'s pool.
    pub fn size_for(&self, name: &TemplateName) -> usize {
        self.sizes.get(name).copied().unwrap_or(self.default_size)
    }
}

/// One pool as [`crate::Node::pool_stats`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolStats {
    /// The template build the pool holds VMs of.
    pub template: TemplateRef,
    /// How many members it keeps now (it follows demand).
    pub target: usize,
    /// The least it keeps.
    pub floor: usize,
    /// How many are ready (restored, warmed, paused) right now.
    pub ready: usize,
    /// How many are being made.
    pub making: usize,
    /// Creates served from the pool (a member that was ready, or one being made that the
    /// create waited for).
    pub hits: u64,
    /// Of the hits, the creates that waited for a member being made.
    pub waits: u64,
    /// Creates that found it empty and restored the normal way.
    pub misses: u64,
}
