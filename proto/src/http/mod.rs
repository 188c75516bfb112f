//! HTTP frontend (KServe v2 REST + Triton extensions).
