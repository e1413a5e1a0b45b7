//! The bloomgate SKU service.
