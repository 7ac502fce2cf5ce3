"""The Streamlit dashboard: renders what pipeline and analytics computed."""
