"""The UI's pages and forms: thin routes over service/ui/views and the domains' service functions."""
