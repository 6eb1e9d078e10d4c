from rest_framework.pagination import PageNumberPagination


class JobPagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
